"""Loading without reading the whole model: the mmap shim (harness/engine/native/lazymap.c) keeps llama.cpp from
populating the model file's mapping, so a load reads at most the dense bytes + 5% from storage, and the
output is the same token for token as with llama.cpp's own populating load (`--load-populate on`).

Bytes are measured, not timed: /proc/self/io read_bytes across the load, after the file's pages were
dropped from the page cache (posix_fadvise DONTNEED), as the engine writes it in `load_read_bytes`."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from harness.campaigns.pagecache import evict_model_files
from harness.engine.io import lazymap
from harness.synth import ModelSpec, make_model
from tests.helpers.engine import bmoe

needs_shim = pytest.mark.skipif(lazymap.shim_path() is None, reason="the mmap shim (_lazymap*.so) is not built")

_MAP_PROBE = r"""
import ctypes, mmap, os, sys
def io():
    for line in open("/proc/self/io"):
        if line.startswith("read_bytes:"):
            return int(line.split()[1])
libc = ctypes.CDLL(None)
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
fd = os.open(sys.argv[1], os.O_RDONLY)
size = os.fstat(fd).st_size
before = io()
addr = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED | mmap.MAP_POPULATE, fd, 0)
assert addr not in (None, ctypes.c_void_p(-1).value)
print(io() - before)
"""


def _write_synced(path: Path, data: bytes) -> None:
    path.write_bytes(data)
    _sync(path)


def _sync(path: Path) -> None:
    """Written pages are dirty, and DONTNEED drops only clean ones: flush before evicting."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _io_accounting_works(tmp: Path) -> bool:
    """Does /proc/self/io count reads here (some containers report 0)? Read a fresh, evicted file."""
    p = tmp / "probe.bin"
    _write_synced(p, os.urandom(4 << 20))
    evict_model_files(p)
    r = subprocess.run([sys.executable, "-c", "import sys; open(sys.argv[1],'rb').read();"
                        "print(next(int(x.split()[1]) for x in open('/proc/self/io') if x.startswith('read_bytes')))",
                        str(p)], capture_output=True, text=True, check=True)
    return int(r.stdout) >= 4 << 20


def _probe(path: Path, env: dict[str, str]) -> int:
    evict_model_files(path)
    r = subprocess.run([sys.executable, "-c", _MAP_PROBE, str(path)], capture_output=True, text=True,
                       env={**os.environ, **env}, check=True)
    return int(r.stdout)


@needs_shim
def test_shim_drops_populate_for_the_named_file_only(tmp_path):
    if not _io_accounting_works(tmp_path):
        pytest.skip("/proc/self/io does not count reads in this environment")
    f = tmp_path / "model.bin"
    _write_synced(f, os.urandom(16 << 20))
    shim = {"LD_PRELOAD": lazymap.shim_path()}
    named = {**shim, lazymap.FILES_ENV: lazymap.file_ids([f])}
    other = {**shim, lazymap.FILES_ENV: "1:1"}
    assert _probe(f, {}) >= 16 << 20  # llama.cpp's populate reads the whole file
    assert _probe(f, other) >= 16 << 20  # another file named: this one is still populated
    assert _probe(f, named) < 1 << 20  # named: nothing read at map time


def test_reexec_env_is_once_only_and_keeps_the_old_preload():
    p = lazymap.shim_path()
    if p is None:
        assert lazymap.reexec_env({}) is None  # not built: no re-exec, the load populates
        return
    env = lazymap.reexec_env({"LD_PRELOAD": "/x/other.so", "A": "1"})
    assert env is not None and env["LD_PRELOAD"] == f"{p} /x/other.so" and env["A"] == "1"
    assert env[lazymap.GUARD_ENV] == "/x/other.so"
    assert lazymap.reexec_env(env) is None  # the guard: never a second time
    assert lazymap.reexec_env({"LD_PRELOAD": p}) is None  # already there


def test_in_process_load_says_it_populates(tmp_path):
    """The shim only works when preloaded: an in-process engine (this test process) populates and says why."""
    f = tmp_path / "m.gguf"
    f.write_bytes(b"\0" * 4096)
    with lazymap.unpopulated([f], want_populate=False) as out:
        assert lazymap.FILES_ENV not in os.environ
    assert out[0].populate and ("not preloaded" in out[0].note or "not built" in out[0].note)
    with lazymap.unpopulated([f], want_populate=True) as out:
        pass
    assert out[0].populate and "--load-populate" in out[0].note


@pytest.fixture(scope="module")
def wide_model(tmp_path_factory) -> Path:
    """~100 MB, of which under 3% dense: 4 layers x 32 Q8_0 experts of 256x1024."""
    d = tmp_path_factory.mktemp("load")
    path = make_model(d / "wide.gguf", ModelSpec(n_expert=32, n_expert_used=4, n_ff_exp=1024, expert_type="q8_0",
                                                 seed=11))[0]
    _sync(path)
    return path


def _cold(model: Path, *flags: str, tmp: Path):
    evict_model_files(model)
    r = bmoe(model, *flags, n=12, tmp=tmp)
    assert r.rc == 0, r.stderr
    return r


@pytest.mark.engine
@needs_shim
def test_load_reads_at_most_dense_bytes_and_output_is_unchanged(wide_model, tmp_path):
    if not _io_accounting_works(tmp_path):
        pytest.skip("/proc/self/io does not count reads in this environment")
    size = wide_model.stat().st_size
    for mode in ([], ["--moe-stream", "--cache-mb", "0"]):
        full = _cold(wide_model, *mode, "--load-populate", "on", tmp=tmp_path)
        lazy = _cold(wide_model, *mode, "--load-populate", "off", tmp=tmp_path)
        dense = int(lazy.preamble["dense_bytes"])
        assert dense < 0.05 * size  # the model is mostly experts, so the bound below means something
        assert full.preamble["load_populate"] == "1" and int(full.preamble["load_read_bytes"]) >= 0.95 * size
        assert lazy.preamble["load_populate"] == "0", lazy.preamble["load_populate_note"]
        assert "mmap shim" in lazy.preamble["load_populate_note"]
        assert int(lazy.preamble["load_read_bytes"]) <= 1.05 * dense
        assert lazy.tokens == full.tokens and len(lazy.tokens) == 12
