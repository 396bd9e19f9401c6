"""The fleet scheduler's rules (harness.campaigns.fleet.scheduler), on in-process devices: every device at once,
compare binds a run to its device, spread shares, a device that goes away is waited for within the grace
time and then given up (its runs to the others in spread, not run in compare), one writer sees every event.
The same rules over real adbd devices: tests/bench/test_fleet_adb.py."""

from __future__ import annotations

import threading
import time

import pytest

from harness.campaigns.fleet.scheduler import Member, schedule
from harness.errors import UserError


class Box:
    """A device in this process: runs take `run_s`; `alive` False makes it stop answering."""

    def __init__(self, label: str, run_s: float = 0.05):
        self.label, self.run_s = label, run_s
        self.alive = True
        self.ran: list[int] = []
        self.opens = 0
        self.fail_at: int | str | None = None  # a run index whose run loses the device, or "first"
        self.back_after: int | None = None  # refused opens before it answers again
        self.refused = 0

    def open(self):
        if not self.alive and self.back_after is not None and self.refused >= self.back_after:
            self.alive = True
        if not self.alive:
            self.refused += 1
            raise OSError(f"{self.label} not listed")
        self.opens += 1
        return Sess(self)


class Sess:
    def __init__(self, box: Box):
        self.box = box
        self.stopped = False

    def run_one(self, i: int):
        time.sleep(self.box.run_s)
        if self.stopped:
            raise KeyboardInterrupt
        if self.box.fail_at in (i, "first"):
            self.box.alive = False
            return ("failed", "device gone")
        self.box.ran.append(i)
        return ("ok", None)

    def gone(self):
        return None if self.box.alive else f"{self.box.label} is gone"

    def interrupt(self):
        self.stopped = True

    def close(self):
        pass


def _run(boxes, pending, owner=None, grace_s=1.0):
    seen = []
    writer = []

    def on_events(batch):
        writer.append(threading.get_ident())
        seen.extend(batch)

    rep = schedule(pending, [Member(b.label, b.open) for b in boxes], owner=owner, on_events=on_events,
                   grace_s=grace_s, poll_s=0.05)
    assert set(writer) == {threading.get_ident()}  # one writer: the calling thread
    return rep, seen


def test_all_devices_work_at_once_and_spread_shares_the_runs():
    boxes = [Box(f"d{k}", run_s=0.2) for k in range(4)]
    t0 = time.monotonic()
    rep, seen = _run(boxes, list(range(8)))
    took = time.monotonic() - t0
    assert rep.not_run == [] and rep.lost == {}
    assert sorted(i for b in boxes for i in b.ran) == list(range(8))
    assert all(b.ran for b in boxes)  # 8 runs of 0.2 s over 4 devices: every one took some
    assert took < 0.2 * 8 / 2, took  # at once, not one after another (1.6 s)
    done = [e for e in seen if e.kind == "done"]
    assert sorted(e.index for e in done) == list(range(8))
    assert {e.label for e in done} == {"d0", "d1", "d2", "d3"}


def test_compare_binds_each_run_to_its_device():
    boxes = [Box("a"), Box("b", run_s=0.01)]
    owner = {i: ("a" if i < 3 else "b") for i in range(6)}
    rep, _ = _run(boxes, list(range(6)), owner=owner.get)
    assert boxes[0].ran == [0, 1, 2] and boxes[1].ran == [3, 4, 5]  # b is faster, but never takes a's runs
    assert rep.not_run == []


def test_compare_device_lost_after_grace_leaves_its_runs_not_run():
    boxes = [Box("a"), Box("b")]
    boxes[1].fail_at = 4
    owner = {i: ("a" if i < 3 else "b") for i in range(7)}
    t0 = time.monotonic()
    rep, seen = _run(boxes, list(range(7)), owner=owner.get, grace_s=0.5)
    assert boxes[0].ran == [0, 1, 2] and boxes[1].ran == [3]
    assert rep.not_run == [5, 6]  # the lost device's queue: not run (run 4 ended, failed, with its reason)
    assert "b not listed" in rep.lost["b"] and "of 0.5 s grace" in rep.lost["b"]
    assert time.monotonic() - t0 >= 0.5  # it waited the grace time
    assert [e.kind for e in seen if e.label == "b"].count("waiting") >= 2


def test_spread_device_lost_hands_its_share_to_the_others():
    boxes = [Box("a", run_s=0.1), Box("b")]
    boxes[1].fail_at = "first"
    rep, seen = _run(boxes, list(range(10)), grace_s=0.2)
    failed = [e.index for e in seen if e.kind == "done" and e.result[0] == "failed"]
    assert rep.not_run == [] and "b" in rep.lost and len(failed) == 1 and boxes[1].ran == []
    assert sorted(boxes[0].ran) == [i for i in range(10) if i != failed[0]]  # b's share went to a


def test_device_back_within_grace_goes_on_with_its_queue():
    boxes = [Box("a")]
    boxes[0].fail_at = 1
    boxes[0].back_after = 3
    rep, seen = _run(boxes, list(range(4)), owner=lambda i: "a", grace_s=5.0)
    assert rep.not_run == [] and rep.lost == {}
    assert boxes[0].ran == [0, 2, 3] and boxes[0].opens == 2
    assert "back" in [e.kind for e in seen]


def test_device_unreachable_at_start_is_waited_for_then_given_up():
    boxes = [Box("a"), Box("b")]
    boxes[1].alive = False
    rep, _ = _run(boxes, list(range(4)), owner=lambda i: "ab"[i % 2], grace_s=0.2)
    assert rep.not_run == [1, 3] and "not listed" in rep.lost["b"]


def test_a_user_error_gives_that_device_up_and_a_bug_stops_everything():
    class Bad(Box):
        def open(self):
            s = super().open()
            s.run_one = lambda i: (_ for _ in ()).throw(self.exc)
            return s

    a, b = Box("a"), Bad("b")
    b.exc = UserError("b: cannot stat the model")
    rep, _ = _run([a, b], list(range(6)), grace_s=0.2)
    assert rep.lost["b"].startswith("given up: b: cannot stat the model") and sorted(a.ran) == list(range(6))
    b2 = Bad("b")
    b2.exc = TypeError("a bug")
    with pytest.raises(TypeError, match="a bug"):
        _run([Box("a", run_s=0.2), b2], list(range(6)))


def test_ctrl_c_hands_every_finished_run_to_the_writer_even_a_busy_one():
    """The writer is busy (its first batch takes 0.3 s) when Ctrl-C lands in it: the runs that finished meanwhile
    were queued, not recorded; the scheduler hands each one over before it lets the interrupt through, so the
    interrupted manifest can list every run whose folder is committed (CI saw 4 more folders than the manifest)."""
    boxes = [Box(f"d{k}", run_s=0.01) for k in range(3)]
    recorded: list[int] = []
    calls = []

    def on_events(batch):
        calls.append(len(batch))
        if len(calls) == 1:
            time.sleep(0.3)
            raise KeyboardInterrupt
        recorded.extend(e.index for e in batch if e.kind == "done")

    with pytest.raises(KeyboardInterrupt):
        schedule(list(range(500)), [Member(b.label, b.open) for b in boxes], owner=None, on_events=on_events,
                 grace_s=1.0, poll_s=0.05)
    ran = sorted(i for b in boxes for i in b.ran)
    assert len(ran) > 3 and sorted(recorded) == ran, (len(ran), len(recorded))
