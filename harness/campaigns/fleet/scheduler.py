"""The concurrent scheduler of a fleet campaign: the pending runs over N devices at once, one worker thread
per device, and ONE writer (the calling thread) that receives every event in order.

    report = schedule(pending, members, owner=..., on_events=..., grace_s=...)

- `pending`: the indices of the runs to do (in the manifest's run list), in plan order.
- `members`: one `Member` per device: its label and `open()`, which connects to it and stages what its runs
  need, returning a `Session`, or raising (any Exception; its message says why) when it cannot be used now.
  `opened` may hand over sessions already open.
- `owner(i)`: the label of the device run i must run on (compare), or None when any device may (spread).
- `on_events(events)`: called in the calling thread with every batch of events the workers queued, oldest
  first: `Event("start", label, i)`, `Event("done", label, i, result)` (result: whatever Session.run_one
  returned; the run's folder is already committed by its worker), `Event("waiting", label, text=...)`,
  `Event("back", label)`, `Event("lost", label, text=why)`. The writer saves the manifest once per batch. On
  Ctrl-C a "done" may come twice (see below): the writer records a run once.
- A device that does not answer (Session.gone() before each run, or an exception from run_one while it
  does not answer) is waited for up to `grace_s` seconds, re-opened every `poll_s`; back in time, its queue
  goes on; else it is lost: its remaining runs go to the other devices when no owner binds them (spread),
  or are left not run (compare). A UserError from run_one on a device that answers gives that device up
  (its run put back); a ResourceError (a full disk here) or any other exception stops the whole campaign.
- `deferred(result)`: a result that says its run was not started because its device did not meet the cooldown
  condition (cooldown.on_timeout: defer): `Event("deferred", label, i, result, text="again" | "left")`; the run
  goes to the end of its queue (its device's, or the shared one, where a cooler device may take it) while it has
  been deferred at most `max_deferrals` times in this schedule, else it is left unrun (`Report.deferred`). With
  `deferred` given, a device with nothing left to take stays while another holds a shared run that may come back,
  and a shared run a device deferred goes to another device that waits for one before it goes back to the first.
- Ctrl-C (KeyboardInterrupt in the calling thread): every session is interrupted (the engine killed on its
  device), the workers joined, every run that finished meanwhile (or whose news was still queued) handed to
  `on_events` as "done" (and every deferral as "deferred"), and it is re-raised. Runs in progress are then left pending.

Returns a `Report`: the runs no device ran (still pending) and why each lost device was given up. Pure
threading: no adb, no files; harness.campaigns.fleet.rounds runs a campaign's runs through it."""

from __future__ import annotations

import queue
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from harness import interrupts
from harness.campaigns.steady import DeferBudget
from harness.errors import ResourceError, UserError

STOP_WAIT_S = 1.7  # Ctrl-C or SIGTERM: how long the workers get to stop their runs (each kill is bounded: 1.5 s)


class Session(Protocol):
    """A device opened for runs (connected, its files staged)."""

    def run_one(self, index: int) -> Any:
        """Do run `index` and commit its files; its result goes to the writer. Never raises for a failed run."""
        ...

    def gone(self) -> str | None:
        """None while the device answers, else why not (one line)."""
        ...

    def interrupt(self) -> None:
        """From another thread: end the run in progress (its run_one raises KeyboardInterrupt)."""
        ...

    def close(self) -> None: ...


@dataclass
class Member:
    label: str
    open: Callable[[], Session]


@dataclass
class Event:
    kind: str  # start | done | deferred | waiting | back | lost
    label: str
    index: int | None = None
    result: Any = None
    text: str = ""


@dataclass
class Report:
    not_run: list[int] = field(default_factory=list)  # runs no device ran, in plan order
    lost: dict[str, str] = field(default_factory=dict)  # device label -> why it was given up
    deferred: list[int] = field(default_factory=list)  # runs deferred past max_deferrals: not run, not queued


class _Queues:
    """Who runs what next: each device's own runs (compare) and the runs any device may take (spread)."""

    def __init__(self, pending: list[int], owner: Callable[[int], str | None] | None, labels: list[str]):
        self.lock = threading.Lock()
        self.own: dict[str, deque[int]] = {x: deque() for x in labels}
        self.shared: deque[int] = deque()
        self.out: set[int] = set()  # shared runs a device has taken and not yet finished (or put back)
        self.deferred_by: dict[int, str] = {}  # a shared run deferred -> the device that deferred it last
        self.idle: set[str] = set()  # devices waiting for a run to come back
        for i in pending:
            o = owner(i) if owner is not None else None
            (self.own[o] if o is not None else self.shared).append(i)

    def has_work(self, label: str) -> bool:
        with self.lock:
            return bool(self.own[label] or self.shared)

    def take(self, label: str) -> int | None:
        with self.lock:
            if self.own[label]:
                self.idle.discard(label)
                return self.own[label].popleft()
            others_idle = bool(self.idle - {label})
            for k, i in enumerate(self.shared):  # a run this device deferred goes to another one that waits
                if self.deferred_by.get(i) != label or not others_idle:
                    del self.shared[k]
                    self.out.add(i)
                    self.idle.discard(label)
                    return i
            self.idle.add(label)
            return None

    def put_back(self, label: str, i: int, owned: bool) -> None:
        with self.lock:
            self.out.discard(i)
            (self.own[label] if owned else self.shared).appendleft(i)

    def put_last(self, label: str, i: int, owned: bool) -> None:
        """Run i deferred by this device: to the end of its queue (a shared one: noted as deferred by it)."""
        with self.lock:
            self.out.discard(i)
            (self.own[label] if owned else self.shared).append(i)
            if not owned:
                self.deferred_by[i] = label

    def waits(self, label: str, waiting: bool) -> None:
        """This device waits for a run to come back (True), or has stopped waiting (False)."""
        with self.lock:
            (self.idle.add if waiting else self.idle.discard)(label)

    def settle(self, i: int) -> None:
        """Run i is finished, or left: it will not come back to a queue."""
        with self.lock:
            self.out.discard(i)

    def coming_back(self) -> bool:
        """A shared run is on a device now, and may come back (deferred) for another device to take."""
        with self.lock:
            return bool(self.out)

    def waiting(self, label: str) -> int:
        with self.lock:
            return len(self.own[label]) + len(self.shared)

    def left(self) -> list[int]:
        with self.lock:
            return sorted([*self.shared, *(i for q in self.own.values() for i in q)])


class _Fatal(Exception):
    def __init__(self, e: BaseException):
        self.e = e


def schedule(pending: list[int], members: list[Member], *, owner: Callable[[int], str | None] | None,
             on_events: Callable[[list[Event]], None], grace_s: float, poll_s: float = 1.0,
             opened: dict[str, Session] | None = None, deferred: Callable[[Any], bool] | None = None,
             max_deferrals: int = 0) -> Report:
    """Run `pending` over `members`, one worker thread each, all at once (see the module's docstring)."""
    labels = [m.label for m in members]
    if len(set(labels)) != len(labels):
        raise ValueError("schedule: device labels must differ")
    q = _Queues(pending, owner, labels)
    events: queue.Queue[Event | _Fatal | None] = queue.Queue()
    stop = threading.Event()
    report = Report()
    sessions: dict[str, Session] = dict(opened or {})
    lock = threading.Lock()
    budget = DeferBudget(max_deferrals)

    def wait_for(m: Member, why: str) -> Session | None:
        t0 = time.monotonic()
        while not stop.is_set():
            if not q.has_work(m.label):
                return None
            try:
                s = m.open()
                gone = s.gone()
                if gone is None:
                    return s
                why = gone
            except KeyboardInterrupt:
                raise
            except Exception as e:  # not there (yet): wait, within the grace time
                why = _one_line(e)
            waited = time.monotonic() - t0
            if waited >= grace_s:
                events.put(Event("lost", m.label, text=f"{why} (waited {waited:.0f} s of {grace_s:g} s grace)"))
                return None
            events.put(Event("waiting", m.label, text=f"{why}: waiting {waited:.0f}/{grace_s:g} s"))
            stop.wait(poll_s)
        return None

    def work(m: Member) -> None:
        s = sessions.get(m.label)
        why = "not opened yet"
        try:
            while not stop.is_set():
                if not q.has_work(m.label):
                    if deferred is None or not q.coming_back():
                        return
                    q.waits(m.label, True)
                    stop.wait(0.1)  # a run another device holds may be deferred: stay to take it
                    continue
                gone = s.gone() if s is not None else why
                if gone is not None:
                    s = wait_for(m, gone)
                    if s is None:
                        return
                    with lock:
                        sessions[m.label] = s
                    events.put(Event("back", m.label))
                    continue
                i = q.take(m.label)
                if i is None:
                    if deferred is not None and (q.has_work(m.label) or q.coming_back()):
                        stop.wait(0.1)  # only runs this device deferred, left for a device that waits
                        continue
                    return
                events.put(Event("start", m.label, i))
                try:
                    result = s.run_one(i)
                except KeyboardInterrupt:
                    q.put_back(m.label, i, owner is not None and owner(i) is not None)
                    return
                except Exception as e:
                    q.put_back(m.label, i, owner is not None and owner(i) is not None)
                    if isinstance(e, ResourceError):
                        raise _Fatal(e) from None
                    why = s.gone() or ""
                    if why:
                        continue  # the device went away during the run's set-up: wait for it
                    if isinstance(e, UserError):
                        events.put(Event("lost", m.label, text=f"given up: {e}"))
                        return
                    raise _Fatal(e) from None
                if deferred is not None and deferred(result):
                    with lock:
                        again = budget.again(i)
                        if not again:
                            report.deferred.append(i)
                    if again:
                        q.put_last(m.label, i, owner is not None and owner(i) is not None)
                    else:
                        q.settle(i)
                    events.put(Event("deferred", m.label, i, result, text="again" if again else "left"))
                    continue
                q.settle(i)
                events.put(Event("done", m.label, i, result))
        except _Fatal as f:
            events.put(f)
        except BaseException as e:  # a bug in a worker: stop everything, say what it was
            events.put(_Fatal(e))
        finally:
            q.waits(m.label, False)
            events.put(None)  # this worker has ended

    threads = [threading.Thread(target=work, args=(m,), name=f"device-{m.label}", daemon=True) for m in members]
    for t in threads:
        t.start()
    running = len(threads)
    fatal: BaseException | None = None
    batch: list = []
    try:
        while running:
            try:
                batch = [events.get(timeout=0.5)]
            except queue.Empty:
                interrupts.check()
                continue
            while True:
                try:
                    batch.append(events.get_nowait())
                except queue.Empty:
                    break
            running -= sum(x is None for x in batch)
            fatal = fatal or next((x.e for x in batch if isinstance(x, _Fatal)), None)
            got = [x for x in batch if isinstance(x, Event)]
            for ev in got:
                if ev.kind == "lost":
                    report.lost[ev.label] = ev.text
            if got:
                on_events(got)
            if fatal is not None and not stop.is_set():
                _stop_all(stop, sessions, lock)
    except BaseException:  # Ctrl-C in the writer: end every run in progress, then let it through
        _stop_all(stop, sessions, lock)
        end = time.monotonic() + STOP_WAIT_S  # the workers kill their engines (bounded); a hung one is left behind
        for t in threads:
            t.join(max(0.0, end - time.monotonic()))
        _hand_over_done(batch, events, on_events)
        raise
    finally:
        for s in list(sessions.values()):
            try:
                s.close()
            except Exception:  # a device that went away: nothing to close there
                pass
    if fatal is not None:
        raise fatal
    report.not_run = q.left()
    report.deferred.sort()
    return report


def _stop_all(stop: threading.Event, sessions: dict[str, Session], lock: threading.Lock) -> None:
    stop.set()
    with lock:
        current = list(sessions.values())
    for s in current:
        try:
            s.interrupt()
        except Exception:
            pass


def _hand_over_done(batch: list, events: queue.Queue, on_events: Callable[[list[Event]], None]) -> None:
    """On Ctrl-C: the runs whose folders were committed but may not be recorded yet (in the batch the writer
    was handling, still queued on a busy writer, or finished while the workers stopped) go to the writer again,
    so the interrupted manifest lists every run that finished (the writer ignores a run it already recorded).
    Best effort: a failure here must not hide the interrupt."""
    done = [x for x in batch if isinstance(x, Event) and x.kind in ("done", "deferred")]
    while True:
        try:
            x = events.get_nowait()
        except queue.Empty:
            break
        if isinstance(x, Event) and x.kind in ("done", "deferred"):
            done.append(x)
    if done:
        try:
            on_events(done)
        except Exception:
            pass


def _one_line(e: BaseException) -> str:
    lines = [x.strip() for x in str(e).splitlines() if x.strip()]
    return lines[-1] if lines else type(e).__name__
