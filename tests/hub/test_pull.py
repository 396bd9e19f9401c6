"""`bmoe pull` against a real loopback hub (tests/helpers/hub.py) through huggingface_hub: the quant picked as
llama.cpp's -hf picks it, every shard under one bar, the cache reused, a dropped connection resumed from the byte
where it was cut (the hub's own request log shows it: no byte sent twice), a Ctrl-C resumed by the next pull, and a
pull from the cache alone with HF_HUB_OFFLINE=1."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from tests.helpers.hub import REPO, Hub
from tests.helpers.pull import blobs, bmoe, one_error, snapshot_entries
from tests.helpers.runner import wait_for

SHARDS = [f"tiny-Q4_K_M-{i:05d}-of-00003.gguf" for i in (1, 2, 3)]


def _data_gets(hub: Hub, name: str) -> list:
    return [e for e in hub.requests(name) if e.method == "GET" and e.server == "cdn"]


def test_a_pull_takes_q4_k_m_with_every_shard_and_reuses_the_cache(hub: Hub, hf_env: Path, repo_dir: Path):
    p = bmoe("pull", REPO)
    assert p.returncode == 0, p.stderr
    first = Path(p.stdout.strip())
    assert first.name == SHARDS[0] and first.parent.parent.name == "snapshots"
    for name in SHARDS:  # side by side in the commit's snapshot, as llama.cpp finds a split model's shards
        assert (first.parent / name).read_bytes() == (repo_dir / name).read_bytes()
        assert len(_data_gets(hub, name)) == 1
    assert not (first.parent / "tiny-Q8_0.gguf").exists()
    assert "and 2 more shard(s)" in p.stderr and "hash checked" in p.stderr
    n = len(hub.log)  # complete: the hub logs each request as it arrives, before its answer
    again = bmoe("pull", REPO)
    assert again.returncode == 0 and again.stdout == p.stdout and "already in the cache" in again.stderr
    assert [e.path.split("?")[0] for e in hub.log[n:]] == [f"/api/models/{REPO}"]  # the listing only, no bytes


def test_a_quant_by_name_any_case_or_a_file_by_path(hub: Hub, hf_env: Path, repo_dir: Path):
    p = bmoe("pull", f"{REPO}:q8_0")
    assert p.returncode == 0, p.stderr
    assert Path(p.stdout.strip()).name == "tiny-Q8_0.gguf"
    q = bmoe("pull", f"{REPO}/{SHARDS[0]}")
    assert q.returncode == 0, q.stderr
    assert sorted(x.name for x in snapshot_entries(hf_env)) == sorted(["tiny-Q8_0.gguf", *SHARDS])


def test_a_cut_connection_resumes_where_it_was_cut_and_reads_no_byte_twice(hub: Hub, hf_env: Path,
                                                                            repo_dir: Path):
    name = SHARDS[1]
    size = (repo_dir / name).stat().st_size
    cut = 1_000_003
    hub.cut_after[name] = cut
    p = bmoe("pull", REPO)
    assert p.returncode == 0, p.stderr
    gets = _data_gets(hub, name)
    assert [(g.range, g.sent) for g in gets] == [(None, cut), (f"bytes={cut}-", size - cut)]
    assert sum(g.sent for g in gets) == size  # every byte sent once
    assert (Path(p.stdout.strip()).parent / name).read_bytes() == (repo_dir / name).read_bytes()


def test_ctrl_c_then_the_next_pull_resumes_from_the_partial_file(hub: Hub, hf_env: Path, repo_dir: Path):
    name = "tiny-Q8_0.gguf"
    size = (repo_dir / name).stat().st_size
    hub.throttle = 0.02  # 64 KiB per 20 ms
    # and the link stalls after 4 MiB until the test releases it: however slow the machine, the Ctrl-C comes while
    # the download is under way
    stalled, go_on = threading.Event(), threading.Event()

    def stall() -> None:
        stalled.set()
        go_on.wait(120)

    hub.on_bytes = (name, 4 << 20, stall)
    # SIGINT as a terminal delivers it: to a process that has Ctrl-C's default disposition (a suite started in the
    # background by a script inherits SIGINT ignored, and the engine rightly keeps an ignored SIGINT ignored)
    a = subprocess.Popen([sys.executable, "-m", "harness.engine.cli", "pull", f"{REPO}:Q8_0"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=dict(os.environ),
                         preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        assert stalled.wait(60), "the download never reached 4 MiB"
        part = wait_for(lambda: next((b for b in blobs(hf_env) if b.name.endswith(".incomplete")
                                      and b.stat().st_size > 1 << 20), None), timeout=60)
        a.send_signal(signal.SIGINT)
        out, err = a.communicate(timeout=30)
    finally:
        go_on.set()
    assert a.returncode == 130 and err.strip() == "bmoe: error: interrupted", err
    assert part.exists() and snapshot_entries(hf_env) == []  # kept to resume; nothing looks like a model
    have = part.stat().st_size
    hub.throttle = 0
    t0 = len(hub.log)
    p = bmoe("pull", f"{REPO}:Q8_0")
    assert p.returncode == 0, p.stderr
    gets = [e for e in hub.log[t0:] if e.method == "GET" and e.server == "cdn"]
    assert [(g.range, g.sent) for g in gets] == [(f"bytes={have}-", size - have)]
    assert Path(p.stdout.strip()).read_bytes() == (repo_dir / name).read_bytes()
    assert not part.exists()


def test_offline_the_cache_alone_answers(hub: Hub, hf_env: Path, monkeypatch):
    p = bmoe("pull", REPO)
    assert p.returncode == 0, p.stderr
    hub.close()  # no hub at all now
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    q = bmoe("pull", REPO)
    assert q.returncode == 0, q.stderr
    assert q.stdout == p.stdout
    one_error(bmoe("pull", f"{REPO}:Q8_0"), 2, "no Q8_0 GGUF in the cache (HF_HUB_OFFLINE)", "Q4_K_M")
    one_error(bmoe("pull", "org/other"), 2, "HF_HUB_OFFLINE is set", "never pulled")


def test_offline_a_damaged_cached_file_is_refused_and_removed(hub: Hub, hf_env: Path, monkeypatch):
    p = bmoe("pull", f"{REPO}:Q8_0")
    blob = Path(p.stdout.strip()).resolve()
    with open(blob, "r+b") as f:  # one byte changed in place: a new mtime, so the file is hashed again
        f.seek(4096)
        b = f.read(1)
        f.seek(4096)
        f.write(bytes([b[0] ^ 1]))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    one_error(bmoe("pull", f"{REPO}:Q8_0"), 65, "is not the hub's", "removed it from the cache")
    assert not blob.exists() and snapshot_entries(hf_env) == []
    monkeypatch.delenv("HF_HUB_OFFLINE")
    time.sleep(0.01)
    assert bmoe("pull", f"{REPO}:Q8_0").returncode == 0  # online, fetched again

