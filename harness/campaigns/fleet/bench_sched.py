"""`python -m harness.campaigns.fleet.bench_sched`: how far one harness process goes, measured on simulated devices
(harness.targets.sim: no engine process, each run waits --run-s seconds and writes a made-up CSV; everything
the harness does for a run is its real code). One campaign per call, in a temporary folder removed after:

    python -m harness.campaigns.fleet.bench_sched --devices 200 --runs 10000 --run-s 1 \
        --out bench-data/<folder>/results.jsonl

appends one JSON line: the campaign's wall time (whole, and from its first run's start to its last run's end),
the process's CPU time, and from them the harness's overhead per run: the device-seconds not spent in an engine,
per run ((devices x run-phase wall - runs x run_s) / runs), and its CPU per run; the manifest's size, and the time
to load it (load_manifest, best of 3) and to save it (save_manifest, best of 3). `--devices N`: a spread fleet
campaign over N simulated devices (harness.campaigns.fleet.run, one worker per device); `--sequential`: the plain
one-target runner (harness.campaigns.runner) on one.
Not measured: a real engine, a real device, adb (a device over USB adds its own transfer and shell time per run)."""

from __future__ import annotations

import argparse
import calendar
import json
import math
import os
import resource
import shutil
import sys
import tempfile
import textwrap
import time
from io import StringIO
from pathlib import Path

from rich.console import Console

from harness.formats.folder import MANIFEST
from harness.formats.manifest import load_manifest, save_manifest
from harness.targets.sim import SimTarget

CELLS = 10


def write_campaign(d: Path, runs: int, devices: int | None, name: str = "sched") -> Path:
    """A campaign of CELLS cells and runs / CELLS repeats, its engine a script that only answers --version:
    on one target (devices None: the sequential runner), or a spread fleet of `devices` simulated devices."""
    exe = d / "sim-engine"
    exe.write_text("#!/bin/sh\necho sim-engine 1.0\n")
    exe.chmod(0o755)
    model = d / "model.bin"
    model.write_bytes(b"\0" * 4096)
    p = d / f"{name}.yaml"
    fleet = "" if devices is None else "targets:\n" + "".join(
        f"  - {{serial: sim{i:03d}, label: sim-{i:03d}}}\n" for i in range(devices)) + \
        "fleet: {use: spread, device_grace_s: 5}\n"
    where = "path" if devices is None else "push_from"
    p.write_text(textwrap.dedent(f"""\
        name: {name}
        model: {{{where}: {model}}}
        engine: {{kind: external, {where}: {exe}}}
        flags: {{--x: 0}}
        axes:
          - flag: --x
            values: [{", ".join(str(i) for i in range(1, CELLS))}]
        repeats: {max(1, runs // CELLS)}
        tokens: 4
        warmup_tokens: 1
        order: interleaved
        cooldown: {{mem_available_min_mib: 64, max_wait_s: 5}}
        timeout_s: 600
        """) + fleet)
    return p


def run_sim(p: Path, root: Path, devices: int | None, run_s: float) -> Path:
    """The campaign on its simulated device(s); its folder."""
    from harness.campaigns.runner import run_campaign

    console = Console(file=StringIO(), width=120)
    if devices is None:
        return run_campaign(p, root=root, console=console, target=SimTarget("sim-000", run_s=run_s)).folder
    return run_campaign(p, root=root, console=console,
                        fleet_target=lambda d: SimTarget(d.label, run_s=run_s)).folder


def _best(f, n: int = 3) -> float:
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        f()
        out.append(time.perf_counter() - t0)
    return min(out)


def _epoch(iso: str) -> float:
    """Seconds since the epoch of a record's UTC time (store.iso)."""
    return calendar.timegm(time.strptime(iso[:19], "%Y-%m-%dT%H:%M:%S")) + float(iso[19:-1] or 0)


def measure(devices: int, runs: int, run_s: float, *, sequential: bool = False) -> dict:
    """One campaign of `runs` runs on `devices` simulated devices (sequential: the one-target runner)."""
    d = Path(tempfile.mkdtemp(prefix="bmoe-bench-sched-"))
    try:
        p = write_campaign(d, runs, None if sequential else devices)
        cpu0, t0 = time.process_time(), time.perf_counter()
        folder = run_sim(p, d / "bd", None if sequential else devices, run_s)
        wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
        m = load_manifest(folder)
        starts = [_epoch(r.start) for r in m.runs if r.start]
        ends = [_epoch(r.end) for r in m.runs if r.end]
        phase = max(ends) - min(starts)
        n = len(m.runs)
        size = (folder / MANIFEST).stat().st_size
        load_s = _best(lambda: load_manifest(folder))
        save_s = _best(lambda: save_manifest(folder, m))
        return {
            "runner": "sequential" if sequential else "fleet", "devices": devices, "runs": n, "run_s": run_s,
            "ok": sum(r.status == "ok" for r in m.runs),
            "wall_s": round(wall, 3), "run_phase_s": round(phase, 3), "cpu_s": round(cpu, 3),
            "overhead_ms_per_run": round(1000 * (devices * phase - n * run_s) / n, 2),
            "cpu_ms_per_run": round(1000 * cpu / n, 2),
            "manifest_bytes": size, "manifest_load_s": round(load_s, 4), "manifest_save_s": round(save_s, 4),
            "max_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
            "cpus": os.cpu_count(), "loadavg_1m_after": round(os.getloadavg()[0], 2),
        }
    finally:
        shutil.rmtree(d, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m harness.campaigns.fleet.bench_sched",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--devices", type=int, default=1, help="simulated devices of a spread fleet campaign")
    ap.add_argument("--sequential", action="store_true", help="one device, on the one-target runner (no fleet)")
    ap.add_argument("--runs", type=int, default=1000, help=f"runs in all ({CELLS} cells x runs/{CELLS} repeats)")
    ap.add_argument("--run-s", type=float, default=0.0, help="seconds each simulated engine run takes")
    ap.add_argument("--manifest-every-run", action="store_true", help="write the manifest after every run, as the "
                    "harness did before store.ManifestSaver (to measure what holding writes back saves)")
    ap.add_argument("--out", type=Path, default=None, help="append the JSON line to this file too")
    a = ap.parse_args(argv)
    if a.sequential and a.devices != 1:
        ap.error("--sequential runs on one device (--devices 1)")
    if a.manifest_every_run:
        from harness.campaigns import store

        store.ManifestSaver.SHARE = math.inf  # every write goes ahead at once
    row = {**measure(a.devices, a.runs, a.run_s, sequential=a.sequential),
           "manifest_writes": "every run" if a.manifest_every_run else "held back"}
    line = json.dumps(row)
    print(line)
    if a.out is not None:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        with open(a.out, "a") as f:
            f.write(line + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
