"""A simulated device for measuring the harness itself (`python -m harness.campaigns.fleet.bench_sched`): a `Target`
whose engine is no process at all. `run` waits `run_s` seconds (as the harness waits for an engine on a device,
without using a core), then writes the metrics CSV a real engine would (through harness.formats, `tokens`
rows, per-token times seeded by the run's CSV name) and hands it back as fetched. Everything else the
runner does for a run (the cooldown gate, state sampling, the model's sha256, committing the run folder with
its hashes, the manifest) is the real code, so a campaign on it costs what the harness costs.

Never used to measure an engine: its tok/s are made up."""

from __future__ import annotations

import os
import random
import tempfile
import threading
import time
import zlib
from pathlib import Path

from harness.formats.metrics_csv import MetricsWriter, Summary, TokenRow
from harness.targets.base import LineCallback, RunOutcome

# a device's state, always roomy, with the keys a Linux host's sample has (harness.devices.state)
SAMPLE = {"mem_total_mib": 8192.0, "mem_available_mib": 6144.0, "mem_free_mib": 5120.0, "cached_mib": 1024.0,
          "swap_free_mib": 0.0, "thermal": {}, "cpu_temp_c": None, "cpufreq": {}, "battery": None}


class SimTarget:
    kind = "local"

    def __init__(self, label: str = "sim-0", *, run_s: float = 0.0, tokens: int = 4):
        self.label = label
        self.run_s = run_s
        self.tokens = tokens
        self.runs = 0
        self._lock = threading.Lock()
        self._dir = tempfile.mkdtemp(prefix=f"bmoe-run-{os.getpid()}-sim-")

    def describe(self) -> dict:
        return {"kind": "local", "hostname": self.label, "machine": "simulated", "cpus": 8,
                "mem_total_mib": SAMPLE["mem_total_mib"]}

    def stage(self, local: Path, kind: str) -> str:
        return str(local)

    def run(self, argv: list[str], *, timeout_s: float, outputs: list[str], out_dir: Path, log_path: Path,
            on_stdout_line: LineCallback | None = None) -> RunOutcome:
        t0 = time.monotonic()
        with self._lock:
            self.runs += 1
        if argv[-1:] == ["--version"]:
            Path(log_path).write_text("sim-engine 1.0\n")
            return RunOutcome(exit_code=0, reason=None, wall_s=time.monotonic() - t0)
        if self.run_s > 0:
            time.sleep(self.run_s)
        fetched = {}
        csv = next((o for o in outputs if o.endswith(".csv")), None)
        if csv is not None:
            dest = Path(out_dir) / Path(csv).name
            rng = random.Random(zlib.crc32(Path(csv).name.encode()))
            wall = [100.0 * (1 + 0.05 * rng.uniform(-1, 1)) for _ in range(self.tokens)]
            with MetricsWriter(dest, {"engine": "sim-engine 1.0", "device": self.label}) as w:
                for i, x in enumerate(wall, 1):
                    w.row(TokenRow(step=i, steps=self.tokens, wall_ms=x, token_id=2 + i))
                w.summary(Summary(n_decode=self.tokens, decode_s=sum(wall) / 1000))
            fetched[csv] = dest
        Path(log_path).write_text(f"sim-engine: {len(wall) if csv else 0} tokens\n")
        return RunOutcome(exit_code=0, reason=None, wall_s=time.monotonic() - t0, fetched=fetched)

    def run_dir(self) -> str:
        return self._dir

    def sample_state(self) -> dict:
        return {"t": time.time(), **SAMPLE}

    def drop_caches(self) -> bool:
        return False

    def close(self) -> None:
        try:
            os.rmdir(self._dir)
        except OSError:
            pass
