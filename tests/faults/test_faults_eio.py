"""EIO on an expert read is one line, for real: the model is served by a FUSE filesystem (tests/fixtures/eio_fs.py,
fusepy on libfuse2) that fails every read touching one layer's routed experts with EIO, so the kernel fails the
engine's pread exactly as a failing flash block would. The engine exits 3 with one line naming the file and the
offset; it does not fall back to buffered reads (that would only fail again) and prints no traceback.
Needs root, /dev/fuse, libfuse2 and fusepy (`.ci/run` installs them); skips and says which is missing."""

from __future__ import annotations

import ctypes.util
import importlib.util
import os
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import pytest

from harness.engine.model.gguf_layout import load_layout
from harness.synth import ModelSpec, make_model
from tests.helpers.engine import BMOE

pytestmark = pytest.mark.engine
FS = Path(__file__).resolve().parents[1] / "fixtures" / "eio_fs.py"


def _missing() -> str | None:
    if os.geteuid() != 0:
        return "mounting FUSE here needs root"
    if not os.path.exists("/dev/fuse"):
        return "no /dev/fuse"
    if ctypes.util.find_library("fuse") is None:
        return "libfuse2 is not installed (apt-get install libfuse2)"
    if importlib.util.find_spec("fuse") is None:
        return "fusepy is not installed (pip install -e '.[dev]')"
    return None


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    why = _missing()
    if why:
        pytest.skip(why)
    # experts big enough (2.3 MiB per tensor) that the failing range sits far from every dense tensor, so
    # only the reader's expert reads meet it (the dense weights' page-cache readahead never does)
    d = tmp_path_factory.mktemp("eio")
    return make_model(d / "m.gguf", ModelSpec(n_embd=512, n_ff_exp=1024, expert_type="q4_k", seed=1))[0]


def layer1_range(model: Path) -> tuple[int, int]:
    ts = [t for t in load_layout(model).experts.values() if t.layer == 1]
    return min(t.abs_offset for t in ts) + 600_000, max(t.abs_offset + t.nbytes for t in ts) - 600_000


@contextmanager
def served(model: Path, mnt: Path, lo: int, hi: int):
    """The model behind a FUSE mount that fails reads touching [lo, hi) with EIO."""
    mnt.mkdir()
    fs = subprocess.Popen([sys.executable, str(FS), str(model), str(mnt), str(lo), str(hi)],
                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    path = mnt / model.name
    t0 = time.monotonic()
    while not path.exists() and time.monotonic() - t0 < 20 and fs.poll() is None:
        time.sleep(0.05)
    try:
        assert path.exists(), f"the FUSE filesystem did not come up: {fs.stderr.read() if fs.poll() else ''}"
        yield path
    finally:
        subprocess.run(["umount", str(mnt)], capture_output=True)
        try:
            fs.wait(timeout=10)
        except subprocess.TimeoutExpired:
            fs.kill()


def bmoe(model: Path, *flags: str) -> subprocess.CompletedProcess:
    return subprocess.run([*BMOE, "-m", str(model), "--moe-stream", "--cache-mb", "0", "-n", "8", "-t", "1", *flags],
                          capture_output=True, timeout=300)


@pytest.mark.parametrize("odirect", [True, False], ids=["odirect", "buffered"])
def test_eio_on_an_expert_read_is_one_line_naming_the_file(model: Path, tmp_path: Path, odirect: bool) -> None:
    lo, hi = layer1_range(model)
    with served(model, tmp_path / "mnt", lo, hi) as path:
        r = bmoe(path, *([] if odirect else ["--no-odirect"]))
    err = r.stderr.decode("utf-8", "replace")
    assert r.returncode == 3, err
    assert "Traceback" not in err, err
    errs = [ln for ln in err.splitlines() if "error" in ln.lower()]
    assert len(errs) == 1 and err.strip().splitlines()[-1] == errs[0], err
    line = errs[0]
    assert "Input/output error" in line and str(path) in line and "offset" in line, line
    off = int(line.split(" at offset ")[1].split()[0])
    assert lo - 1_000_000 < off < hi, line  # the failing read is one of layer 1's expert reads
    assert "reading buffered" not in err, err  # EIO is not mistaken for O_DIRECT being refused


def test_the_same_mount_without_a_failing_range_gives_the_direct_output(model: Path, tmp_path: Path) -> None:
    """Control: the same filesystem with its failing range past the end of the file streams the model and gives
    the same bytes as reading it directly, so the failure above is the injected EIO, not FUSE."""
    with served(model, tmp_path / "mnt", 1 << 62, 1 << 62) as path:
        r = bmoe(path)
    assert r.returncode == 0, r.stderr.decode("utf-8", "replace")
    direct = bmoe(model)
    assert direct.returncode == 0 and r.stdout == direct.stdout and r.stdout
