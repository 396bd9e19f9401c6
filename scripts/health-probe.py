#!/usr/bin/env python3
"""How fast `bmoe serve` answers /health while it tokenizes the largest prompt its size check accepts (issue 36's
target: within 100 ms). A real server process on loopback, a real HTTP client (httpx):

    .venv/bin/python scripts/health-probe.py MODEL OUT_DIR [--ctx 16384] [--every-ms 20] [--char C] [--flags=...]

1. start `bmoe serve -m MODEL -c CTX --queue 1 --tokenize-timeout 600 --port 0`;
2. learn the vocabulary's longest token from the server's own refusal of a hopeless prompt;
3. send the largest prompt the check lets through, of the text slowest to tokenize (one byte a token on a
   byte-level vocabulary: "\\n" x (CTX - 1) x longest, or up to the 1024 KiB body limit when that is lower;
   --char another), and probe /health every --every-ms while its phase is "tokenizing";
4. write OUT_DIR/probes.csv (one probe a row) and OUT_DIR/summary.json (median, p90, p99, max, the prompt's bytes,
   the tokenizing time, the model's size and sha256, the machine's load).

What it does not show: latency under other clients' traffic (one client here), or on another machine."""

from __future__ import annotations

import argparse
import csv
import hashlib
import json
import os
import re
import shlex
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx


def _sha256(p: Path) -> str:
    h = hashlib.sha256()
    with p.open("rb") as f:
        while b := f.read(1 << 20):
            h.update(b)
    return h.hexdigest()


def _pct(xs: list[float], q: float) -> float:
    return xs[min(len(xs) - 1, int(q * (len(xs) - 1) + 0.5))]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", type=Path)
    ap.add_argument("out", type=Path)
    ap.add_argument("--ctx", type=int, default=16384)
    ap.add_argument("--every-ms", type=float, default=20.0)
    ap.add_argument("--char", default="\n", help="the one character the prompt repeats (default: a newline)")
    ap.add_argument("--flags", default="", help="more `bmoe serve` flags, one string")
    a = ap.parse_args()
    if not a.model.is_file():
        sys.exit(f"health-probe: {a.model}: no such model file; give a GGUF path")
    a.out.mkdir(parents=True, exist_ok=True)
    log = a.out / "serve.log"
    argv = [sys.executable, "-m", "harness.engine.cli", "serve", "-m", str(a.model), "-c", str(a.ctx), "--queue", "1",
            "--tokenize-timeout", "600", "--port", "0", *shlex.split(a.flags)]
    with log.open("w") as err:
        p = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=err)
    try:
        end = time.monotonic() + 300
        while not (m := re.search(r"serving \S+ on (http://[\d.]+:\d+)", log.read_text())):
            if p.poll() is not None or time.monotonic() > end:
                sys.exit(f"health-probe: the server did not start (see {log})")
            time.sleep(0.1)
        url = m.group(1)
        http = httpx.Client(base_url=url, timeout=600)
        r = http.post("/v1/completions", json={"prompt": "x" * 1_000_000, "max_tokens": 1})  # under the body limit
        said = re.search(r"longest token is (\d+) bytes", r.text)
        if said is None:
            sys.exit(f"health-probe: a 1 MB prompt was not refused by the size check at -c {a.ctx}: {r.text[:200]}")
        longest = int(said.group(1))
        # the size check's bound, or the request body limit (1024 KiB, the default) when that is lower
        per = len(json.dumps(a.char)) - 2  # its bytes in the JSON body ("\\n" takes 2)
        prompt = a.char * min((a.ctx - 1) * longest, (1024 * 1024 - 256) // per)
        got: list[httpx.Response] = []
        t = threading.Thread(target=lambda: got.append(httpx.post(url + "/v1/completions", timeout=600,
                                                                  json={"prompt": prompt, "max_tokens": 1})))
        t0 = time.monotonic()
        t.start()
        while http.get("/health").json()["running_phase"] != "tokenizing":
            if not t.is_alive() or time.monotonic() - t0 > 300:
                t.join()
                said = got[0].text[:200] if got else "no answer"
                sys.exit(f"health-probe: the prompt ({len(prompt)} bytes) was never seen tokenizing: {said}")
            time.sleep(0.005)
        probes: list[tuple[float, float]] = []
        while t.is_alive():
            s = time.monotonic()
            phase = http.get("/health").json()["running_phase"]
            probes.append((s - t0, time.monotonic() - s))
            if phase != "tokenizing":
                break
            time.sleep(a.every_ms / 1000)
        t.join()
        tok_s = time.monotonic() - t0
        answer = got[0]
        p.terminate()
        rc = p.wait(timeout=30)
    finally:
        if p.poll() is None:
            p.kill()
    with (a.out / "probes.csv").open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["since_sent_s", "health_latency_ms"])
        w.writerows((f"{x:.4f}", f"{y * 1e3:.2f}") for x, y in probes)
    lat = sorted(y for _, y in probes)
    summary = {
        "model": a.model.name, "model_bytes": a.model.stat().st_size, "model_sha256": _sha256(a.model),
        "ctx": a.ctx, "longest_token_bytes": longest, "prompt_bytes": len(prompt), "prompt_char": a.char,
        "answer": f"{answer.status_code} {answer.json().get('error', {}).get('code', '')}".strip(),
        "tokenizing_and_answer_s": round(tok_s, 2), "probes": len(lat),
        "median_ms": round(_pct(lat, 0.5) * 1e3, 2), "p90_ms": round(_pct(lat, 0.9) * 1e3, 2),
        "p99_ms": round(_pct(lat, 0.99) * 1e3, 2), "max_ms": round(lat[-1] * 1e3, 2),
        "within_100ms_pct": round(100 * sum(x < 0.1 for x in lat) / len(lat), 2),
        "server_exit": rc, "loadavg_1m_at_end": os.getloadavg()[0], "cpus": os.cpu_count(),
        "command": " ".join(shlex.quote(x) for x in sys.argv),
    }
    (a.out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
