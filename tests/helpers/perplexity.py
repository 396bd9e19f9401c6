"""llama.cpp's own `llama-perplexity`, when scripts/build-llama-perplexity.sh has built it: where it is (or skip the
test saying how to build it), running it in its --kl-divergence layout, and reading its KL-divergence figures."""

from __future__ import annotations

import os
import re
import subprocess
import tempfile
from pathlib import Path

import numpy as np
import pytest

FLAGS_FILE = "build-flags"
PATCH = "patch=log-flush-at-exit"  # scripts/build-llama-perplexity.sh: its log flushed before main returns


def perplexity_path() -> Path:
    """$BMOE_PERPLEXITY_DIR/llama-perplexity (default ~/.cache/bmoe/llama-perplexity/llama-perplexity)."""
    d = os.environ.get("BMOE_PERPLEXITY_DIR") or (Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
                                                 / "bmoe" / "llama-perplexity")
    return Path(d) / "llama-perplexity"


def llama_perplexity() -> Path:
    p = perplexity_path()
    if not os.access(p, os.X_OK):
        pytest.skip(f"llama-perplexity is not built at {p}: run scripts/build-llama-perplexity.sh (needs cmake, g++)")
    flags = p.parent / FLAGS_FILE
    if PATCH not in (flags.read_text() if flags.is_file() else ""):
        pytest.skip(f"llama-perplexity at {p} was built without its log flushed at exit: run "
                    "scripts/build-llama-perplexity.sh again")
    return p


def run(binary: Path, model: Path, ctx: int, *flags: str, until: str = "") -> str:
    """One llama-perplexity run in bmoe's scoring layout: one chunk per batch (-b ctx: no parallel sequences), the
    weights as bmoe loads them (no repacking), flash attention off (bmoe's default), 2 threads. Its log, which must
    hold `until`: the build flushes llama.cpp's asynchronous log before main returns (PATCH), without which a busy
    machine lost its last lines (5 runs of 5 beside three test suites and two CPU burners)."""
    argv = [str(binary), "-m", str(model), "-c", str(ctx), "-b", str(ctx), "-t", "2", "--no-repack", "-fa", "off",
            *flags]
    with tempfile.TemporaryFile() as out:
        p = subprocess.run(argv, stdout=out, stderr=subprocess.STDOUT, timeout=900)
        out.seek(0)
        log = out.read().decode("utf-8", "replace")
    assert p.returncode == 0, log[-3000:]
    assert until in log, f"llama-perplexity's log does not hold {until!r}: {log[-2000:]}"
    return log


def base_tokens(path: Path) -> np.ndarray:
    """The tokens a --kl-divergence-base file holds ("_logits_", n_ctx u32, n_vocab i32, n_chunk i32, tokens)."""
    b = path.read_bytes()
    assert b[:8] == b"_logits_"
    n_ctx, _n_vocab, n_chunk = np.frombuffer(b, dtype="<i4", count=3, offset=8)
    return np.frombuffer(b, dtype="<i4", count=int(n_ctx) * int(n_chunk), offset=20).reshape(int(n_chunk), int(n_ctx))


def _pm(log: str, label: str) -> tuple[float, float]:
    m = re.search(rf"^{re.escape(label)}\s*:\s*(-?[\d.]+)\s*±\s*([\d.]+)", log, flags=re.M)
    assert m, f"no {label!r} in llama-perplexity's output"
    return float(m.group(1)), float(m.group(2))


def _one(log: str, label: str) -> float:
    m = re.search(rf"^{re.escape(label)}\s*:\s*(-?[\d.]+)", log, flags=re.M)
    assert m, f"no {label!r} in llama-perplexity's output"
    return float(m.group(1))


def kld_figures(log: str) -> dict[str, float]:
    """Its KL-divergence statistics: KLD mean and its error, p99, max; same-top % and its error; RMS Δp %."""
    kld, kld_se = _pm(log, "Mean    KLD")
    same, same_se = _pm(log, "Same top p")
    rms, rms_se = _pm(log, "RMS Δp    ")
    return {"kld_mean": kld, "kld_se": kld_se, "kld_p99": _one(log, "99.0%   KLD"), "kld_max": _one(log, "Maximum KLD"),
            "same_top_pct": same, "same_top_se_pct": same_se, "dp_rms_pct": rms, "dp_rms_se_pct": rms_se}
