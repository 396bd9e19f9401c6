"""bmoe-bench mincap's parts that need no cgroup: the criterion, the bisection (against a known edge), the mincap
records, and the smaps breakdown on this very process's real mappings."""

from __future__ import annotations

import ctypes
import json
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from harness.engine.io.vm import Reservation
from harness.errors import UserError
from harness.formats import mincap as fmt
from harness.memcap.search import Criterion, RunFacts, bisect
from harness.memcap.smaps import breakdown, cgroup_charge, kinds, parse_memory_stat, parse_smaps

MIB = 1 << 20
OK = RunFacts(exit_code=0, oom_kills=0, timed_out=False, tokens=12, tok_s=10.0)


def test_criterion_names_each_way_a_run_fails():
    c = Criterion(tokens=12, roomy_tok_s=10.0, slowdown=2.0)
    assert c.verdict(OK) is None
    assert c.verdict(RunFacts(None, 1, False, 3, None)) == "OOM-killed (1)"
    assert c.verdict(RunFacts(None, 0, True, 3, None)) == "timed out"
    assert c.verdict(RunFacts(3, 0, False, 0, None)) == "exit 3"
    assert c.verdict(RunFacts(None, 0, False, 0, None)) == "killed by a signal"
    assert c.verdict(RunFacts(0, 0, False, 11, 10.0)) == "11 of 12 tokens"
    assert c.verdict(RunFacts(0, 0, False, 12, 5.0)) is None  # exactly half: still runs
    slow = c.verdict(RunFacts(0, 0, False, 12, 4.9))
    assert slow is not None and "under 1/2 of the roomy 10.00" in slow
    assert Criterion(tokens=12).verdict(RunFacts(0, 0, False, 12, None)) is None  # the roomy run: no speed floor


@pytest.mark.parametrize("edge", [65, 100, 333, 448, 449, 512])
def test_bisection_finds_a_known_edge_to_the_resolution(edge):
    asked = []

    def probe(cap):
        asked.append(cap)
        return cap >= edge

    s = bisect(probe, 64, 1024, 8)
    assert s.min_cap is not None and s.min_cap % 8 == 0
    assert edge <= s.min_cap < edge + 8  # the smallest multiple of 8 at or above the edge
    assert s.runs[s.min_cap] and not s.runs[s.min_cap - 8]
    assert asked[:2] == [1024, 64] and len(asked) <= 2 + 7  # log2(960 / 8) < 7 halvings
    assert f"runs at {s.min_cap} MiB, fails at {s.min_cap - 8} MiB" == s.note


def test_bisection_says_when_the_bracket_misses_the_edge():
    s = bisect(lambda cap: cap >= 2000, 64, 1024, 16)
    assert s.min_cap is None and "does not run even at 1024 MiB" in s.note and list(s.runs) == [1024]
    s = bisect(lambda cap: True, 64, 1024, 16)
    assert s.min_cap == 64 and "runs already at 64 MiB" in s.note
    with pytest.raises(ValueError):
        bisect(lambda cap: True, 512, 500, 16)


def test_records_round_trip_and_refuse_what_they_do_not_declare(tmp_path: Path):
    probe = {k: None for k in fmt.REQUIRED["probe"]}
    fmt.append(tmp_path, "probe", {**probe, "label": "a", "cap_mib": 64})
    assert fmt.read(tmp_path / fmt.FILE)[0]["label"] == "a"
    with pytest.raises(ValueError):
        fmt.line("probe", {**probe, "surprise": 1})
    with pytest.raises(ValueError):
        fmt.line("probe", {"label": "a"})
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"record": "probe", "v": 1, "label": "a"}\n')
    with pytest.raises(UserError, match="bad.jsonl:1: probe record without"):
        fmt.read(bad)
    bad.write_text('{"record": "probe", "v": 9}\n')
    with pytest.raises(UserError, match="not a mincap v1 record"):
        fmt.read(bad)
    bad.write_text('{"record": "pro')
    with pytest.raises(UserError, match="truncated"):
        fmt.read(bad)


def _kinds() -> dict:
    return breakdown(parse_smaps(Path("/proc/self/smaps").read_text()))


def _thp_size() -> int:
    """The size a page fault may map in an anonymous mapping: the PMD huge page when THP is not off, else 4 KiB."""
    d = Path("/sys/kernel/mm/transparent_hugepage")
    try:
        if "[never]" in (d / "enabled").read_text():
            return 4096
        return int((d / "hpage_pmd_size").read_text())
    except (OSError, ValueError):
        return 4096


def measure_breakdown() -> dict:
    """In the process that calls it: a 16 MiB expert reservation with 4 MiB of it touched, and 128 x 64 KiB malloc'd
    by a new thread (its own arena: under the mmap threshold), then what the smaps breakdown sees."""
    before = _kinds()
    res = Reservation(16 * MIB, 0)  # the engine's own expert reservation
    libc = ctypes.CDLL(None)
    libc.memset.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t]
    libc.memset(res.data, 1, 4 * MIB)  # 4 MiB of it touched
    libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]

    def grab():
        for _ in range(128):
            ctypes.memset(libc.malloc(64 << 10), 1, 64 << 10)

    t = threading.Thread(target=grab)
    t.start()
    t.join()
    vmas = parse_smaps(Path("/proc/self/smaps").read_text())
    after = breakdown(vmas)
    base = res.data
    mine = [(v, k) for v, k in zip(vmas, kinds(vmas), strict=True) if v.start < base + 16 * MIB and v.end > base]
    return {"base": base, "kinds": sorted({k for _, k in mine}), "rss": sum(v.fields.get("Rss", 0) for v, _ in mine),
            "outside": sum(v.end - v.start for v, _ in mine) - 16 * MIB,
            "noreserve": after["anonymous MAP_NORESERVE"].rss - before["anonymous MAP_NORESERVE"].rss,
            "arena": after["malloc thread arenas"].rss - before["malloc thread arenas"].rss,
            "code": after["Python and modules (code)"].rss, "heaps": after["[heap] (malloc main arena)"].count}


def test_breakdown_of_a_fresh_process_sees_a_noreserve_mapping_and_a_thread_arena():
    # measured in a fresh interpreter: in this one, earlier tests' threads leave arenas with room (the new thread's
    # mallocs then add no Rss: a random-order suite saw 0.5 MiB) and mappings beside which the reservation may merge
    r = subprocess.run([sys.executable, "-c", "import json; from tests.bench.test_mincap import measure_breakdown; "
                        "print(json.dumps(measure_breakdown()))"], capture_output=True, text=True, timeout=120,
                       cwd=Path(__file__).resolve().parents[2])
    assert r.returncode == 0, r.stderr
    m = json.loads(r.stdout)
    # the reservation's own mapping: kind MAP_NORESERVE, 4 MiB touched. Resident at most up to the end of the
    # transparent huge page the touched range ends in (where THP may map a whole 2 MiB page), plus, if the kernel
    # merged the mapping with an adjacent one of the same flags, that neighbour's part outside the reservation
    assert m["kinds"] == ["anonymous MAP_NORESERVE"] and m["outside"] >= 0, m
    huge = _thp_size()
    assert 4 * MIB <= m["rss"] <= -(-(m["base"] + 4 * MIB) // huge) * huge - m["base"] + m["outside"], m
    assert m["noreserve"] >= 4 * MIB, m
    assert m["arena"] >= 4 * MIB, m  # 128 x 64 KiB written in a new thread's own arena
    assert m["code"] > 0 and m["heaps"] >= 1, m


def test_cgroup_charge_reads_both_versions():
    v1 = parse_memory_stat("cache 1048576\nrss 2097152\nrss_huge 0\nmapped_file 4096\nshmem 0\n")
    assert cgroup_charge(1, v1, 5 << 20, 1 << 20) == {"usage": 5 << 20, "anon": 2 << 20, "file": 1 << 20,
                                                      "file_mapped": 4096, "shmem": 0, "kernel": 1 << 20}
    v2 = parse_memory_stat("anon 3\nfile 4\nfile_mapped 1\nkernel 7\n")
    assert cgroup_charge(2, v2, 14, None) == {"usage": 14, "anon": 3, "file": 4, "file_mapped": 1, "shmem": None,
                                              "kernel": 7}


def test_tables_show_each_search_and_breakdown(tmp_path: Path, capsys):
    from harness.memcap.table import main as table_main

    fmt.append(tmp_path, "search", {"label": "cxx-160", "argv": ["x"], "resolution_mib": 8, "slowdown": 2.0,
                                    "repeats": 2, "warmup": 2, "roomy_cap_mib": 4096, "roomy_tok_s": 9.5,
                                    "roomy_peak_mib": 612.3, "min_cap_mib": 408, "fails_at_mib": 400,
                                    "note": "runs at 408 MiB, fails at 400 MiB", "host": "h"})
    kinds = {k: {"rss_mib": 0.0, "anon_mib": 0.0, "size_mib": 0.0, "count": 0} for k in ("[heap] (malloc main "
                                                                                            "arena)",)}
    kinds["anonymous MAP_NORESERVE"] = {"rss_mib": 300.5, "anon_mib": 300.5, "size_mib": 1000.0, "count": 3}
    fmt.append(tmp_path, "breakdown", {"label": "cxx-160", "cap_mib": 408, "argv": ["x"], "kinds": kinds,
                                       "rollup_mib": {"Rss": 350.0, "Anonymous": 320.0},
                                       "charge_mib": {"usage": 400.0, "anon": 330.0, "file": 60.0,
                                                      "file_mapped": 10.0, "kernel": 10.0},
                                       "peak_mib": 407.9, "engine_lines": []})
    assert table_main([str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "| cxx-160 | 9.50 | 612.3 | 408 | 400 | 2 | runs at 408 MiB, fails at 400 MiB |" in out
    assert "| anonymous MAP_NORESERVE | 300.5 (300.5) |" in out and "[heap]" not in out  # a kind with no mapping
    assert "| cgroup file | 60 |" in out and "| cgroup peak | 407.9 |" in out
    assert table_main([str(tmp_path / "none")]) == 2
