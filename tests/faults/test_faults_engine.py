"""The engine never dies without a line: a model file truncated under a real running `bmoe` (a tiny
generated model) is one line on stderr and exit status 4, with the compiled SIGBUS handler and with its
pure-Python fallback; streamed, the expert read that comes up short is one line and status 3."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from harness.engine.io import lazymap
from harness.synth import ModelSpec, make_model
from tests.helpers.engine import BMOE

pytestmark = pytest.mark.engine


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("truncmodel")
    return make_model(d / "tiny.gguf", ModelSpec(expert_type="q4_k", seed=14))[0]


def truncated_mid_run(model: Path, tmp: Path, *flags: str, env: dict[str, str] | None = None
                      ) -> subprocess.CompletedProcess:
    """Run bmoe on a copy of the model, truncate the copy to half after the first generated token."""
    m = tmp / "m.gguf"
    shutil.copyfile(model, m)
    out = tmp / "out.txt"
    with open(out, "w") as fo:
        p = subprocess.Popen([*BMOE, "-m", str(m), "-c", "2048", "-n", "2000", "-t", "2", "--progress", *flags],
                             stdout=fo, stderr=subprocess.PIPE, text=True, env={**os.environ, **(env or {})})
        t0 = time.monotonic()
        while "BMOE_PROGRESS" not in out.read_text() and p.poll() is None and time.monotonic() - t0 < 300:
            time.sleep(0.02)
        assert p.poll() is None, "the engine ended before the model could be truncated"
        os.truncate(m, m.stat().st_size // 2)
        _, err = p.communicate(timeout=300)
    return subprocess.CompletedProcess(p.args, p.returncode, "", err)


def last_line_only_error(err: str) -> str:
    assert "Traceback" not in err and "Fatal Python error" not in err, err
    errs = [ln for ln in err.splitlines() if "error" in ln.lower()]
    assert len(errs) == 1, err
    assert err.strip().splitlines()[-1] == errs[0]
    return errs[0]


@pytest.mark.parametrize("watch", ["compiled", "thread"])
def test_model_truncated_under_the_mmap_engine_is_one_line(model, tmp_path, watch):
    if watch == "compiled" and lazymap.shim_path() is None:
        pytest.skip("the compiled helper (harness/engine/native/_lazymap*.so) is not built")
    r = truncated_mid_run(model, tmp_path, env={"BMOE_MODEL_WATCH": watch})
    assert r.returncode == 4, r.stderr  # not 135 (SIGBUS) with nothing said
    line = last_line_only_error(r.stderr)
    assert line.startswith("bmoe: error: ") and "m.gguf changed size under the running engine" in line, line
    assert "restore it and run again" in line


def test_model_truncated_under_the_streamed_engine_is_one_line(model, tmp_path):
    r = truncated_mid_run(model, tmp_path, "--moe-stream", "--cache-mb", "0")
    assert r.returncode in (3, 4), r.stderr
    line = last_line_only_error(r.stderr)
    assert ("short read" in line and "truncated" in line) or "changed size" in line, line
