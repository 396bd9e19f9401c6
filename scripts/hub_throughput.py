"""Download throughput from the loopback hub (tests/helpers/hub.py, in a process of its own): `bmoe pull` against
`curl` on the same file, side by side, alternating, each from a fresh cache / to a fresh file on the same disk.

curl fetches the resolve URL and follows the hub's redirect to its CDN, as the pull does; the pull also lists the
repo, asks each file's HEAD, hashes every byte (sha256) and starts a Python interpreter, all inside its time.

    PYTHONPATH=. .venv/bin/python scripts/hub_throughput.py [--mib 512] [--rounds 3]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def serve(folder: Path) -> None:
    """The child: a hub serving `folder` as org/big, its endpoint on stdout, until stdin closes."""
    sys.path.insert(0, str(ROOT))
    from tests.helpers.hub import Hub

    hub = Hub()
    hub.add_repo("org/big", folder)
    print(hub.endpoint, flush=True)
    sys.stdin.read()
    hub.close()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mib", type=int, default=512)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--serve", type=Path)
    a = ap.parse_args()
    if a.serve:
        serve(a.serve)
        return 0
    work = Path(tempfile.mkdtemp(prefix="hub-throughput-"))
    try:
        repo = work / "repo"
        repo.mkdir()
        name = "big-Q4_K_M.gguf"
        with open(repo / name, "wb") as f:
            for _ in range(a.mib):
                f.write(os.urandom(1 << 20))
        size = (repo / name).stat().st_size
        child = subprocess.Popen([sys.executable, __file__, "--serve", str(repo)], stdin=subprocess.PIPE,
                                 stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
        endpoint = child.stdout.readline().strip()
        times: dict[str, list[float]] = {"curl": [], "bmoe pull": []}
        for r in range(a.rounds):
            order = ["curl", "bmoe pull"] if r % 2 == 0 else ["bmoe pull", "curl"]
            for tool in order:
                dest = work / f"out-{r}-{tool.replace(' ', '-')}"
                dest.mkdir()
                if tool == "curl":
                    argv = ["curl", "-sS", "-L", "-o", str(dest / name), f"{endpoint}/org/big/resolve/main/{name}"]
                    env = os.environ
                else:
                    argv = [sys.executable, "-m", "harness.engine.cli", "pull", "org/big"]
                    env = {**os.environ, "HF_ENDPOINT": endpoint, "HF_HOME": str(dest / "hf"),
                           "BMOE_HASH_CACHE": str(dest / "sha.json"), "PYTHONPATH": str(ROOT)}
                t0 = time.perf_counter()
                subprocess.run(argv, check=True, env=env, capture_output=True, cwd=ROOT)
                times[tool].append(time.perf_counter() - t0)
                shutil.rmtree(dest)
        child.stdin.close()
        child.wait(timeout=30)
        print(f"file: {size / 2**20:.0f} MiB, loopback hub {endpoint}, {a.rounds} rounds alternating")
        med = {}
        for tool, ts in times.items():
            med[tool] = size / 2**20 / statistics.median(ts)
            print(f"{tool:10s} median {med[tool]:7.1f} MiB/s  (each: " +
                  ", ".join(f"{size / 2**20 / t:.1f}" for t in ts) + ")")
        print(f"bmoe pull / curl: {med['bmoe pull'] / med['curl']:.2f}x")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
