"""Hostile input to `bmoe` itself (issue 36): a context no machine holds, a model or a trace that is not a regular
file (a FIFO blocked the header read for ever, /dev/zero was read until the machine ran out of memory, /proc/self/mem
gave an EIO traceback), and outputs that cannot be written (a read-only folder, /dev/full: "internal error", exit 3,
the path not named). Each is one `bmoe: error:` line naming the input, a non-zero exit, no traceback, no hang, and
nothing written anywhere else. Real processes, a real FIFO, real devices, a real memory cgroup."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from harness.synth import ModelSpec, make_model
from tests.helpers.engine import BMOE
from tests.helpers.faults import fill, mount_tmpfs

pytestmark = pytest.mark.engine

# root reads and writes anything: drop the capabilities that bypass file permissions
_CAPS = "-dac_override,-dac_read_search"
AS_USER = ("setpriv", f"--inh-caps={_CAPS}", f"--bounding-set={_CAPS}") if os.geteuid() == 0 else ()


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    return make_model(tmp_path_factory.mktemp("hostile") / "m.gguf", ModelSpec(expert_type="q4_k", seed=36))[0]


def run(*argv: str, prefix: tuple[str, ...] = (), timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([*prefix, *BMOE, *argv], capture_output=True, text=True, errors="replace",
                          timeout=timeout, stdin=subprocess.DEVNULL)


def error_line(p: subprocess.CompletedProcess, rc: int, *needles: str) -> str:
    assert p.returncode == rc, (p.returncode, p.stderr[-1500:])
    assert "Traceback" not in p.stderr and "internal error" not in p.stderr, p.stderr
    errs = [ln for ln in p.stderr.splitlines() if ln.startswith("bmoe: error:")]
    assert len(errs) == 1, p.stderr
    for n in needles:
        assert n in errs[0], errs[0]
    return errs[0]


def test_a_context_beyond_llama_cpp_or_memory_is_one_line_before_allocating(model):
    error_line(run("-m", str(model), "-c", "99999999999", "-n", "2"), 2, "-c 99999999999",
               "above llama.cpp's largest context (4294967295)")
    line = error_line(run("-m", str(model), "-c", str(1 << 31), "-n", "2"), 2, f"-c {1 << 31}",
                      "the KV cache alone needs at least", "MemAvailable", "give -c at most")
    assert str(model) in line


def _cgroups() -> str | None:
    from harness.errors import UserError
    from harness.targets.cgroup import CappedCgroup, locate_self

    try:
        with CappedCgroup(locate_self(), 64):
            return None
    except (UserError, OSError) as e:
        return str(e)


@pytest.mark.skipif(_cgroups() is not None, reason="no usable memory cgroup here")
def test_under_a_cap_a_context_that_cannot_fit_is_refused_not_oom_killed(model):
    """Under a 128 MiB cap, -c 200000 of this model's KV cache (about 390 MiB) used to be an OOM kill, exit 137."""
    p = subprocess.run([sys.executable, "-m", "harness.targets.capped", "--mem-mib", "128", "--", *BMOE, "-m",
                        str(model), "-c", "200000", "-n", "2", "-t", "1"], capture_output=True, text=True,
                       errors="replace", timeout=120)
    line = error_line(p, 2, "-c 200000", "the memory cgroup's limit", "give -c at most")
    fits = int(line.split("give -c at most ")[1].split()[0])
    assert 0 < fits < 200000
    assert '"oom_killed": false' in p.stderr


def test_a_fifo_as_the_model_is_refused_at_once(model, tmp_path):
    fifo = tmp_path / "m.gguf"
    os.mkfifo(fifo)
    error_line(run("-m", str(fifo), "-n", "2", timeout=60), 2, f"-m {fifo}", "is a FIFO")


@pytest.mark.parametrize("path,what", [("/proc/self/mem", "is empty"), ("/dev/zero", "is a character device")])
def test_a_special_file_as_the_model_is_refused(path, what):
    error_line(run("-m", path, "-n", "2", timeout=60), 2, f"-m {path}", what)


@pytest.mark.parametrize("flag", ["--route-replay", "--drop-replay", "--prompts-file"])
def test_a_device_or_fifo_as_an_input_file_is_refused_before_reading(model, tmp_path, flag):
    """--route-replay /dev/zero was read whole until the kernel killed the engine for memory."""
    error_line(run("-m", str(model), flag, "/dev/zero", "-n", "2", timeout=60), 2, f"{flag} /dev/zero",
               "is a character device")
    fifo = tmp_path / "trace.csv"
    os.mkfifo(fifo)
    error_line(run("-m", str(model), flag, str(fifo), "-n", "2", timeout=60), 2, f"{flag} {fifo}", "is a FIFO")


OUTPUTS = ["--csv", "--io-trace", "--compute-trace", "--route-trace"]
TEXT = "word " * 200  # four chunks of -c 64 to score


@pytest.mark.parametrize("flag", [*OUTPUTS, "--fidelity-ref"])
def test_an_output_on_a_device_is_refused_before_the_load(model, flag):
    """--fidelity-ref /dev/full (written whole, then renamed over the path) replaced the device with a file."""
    before = os.stat("/dev/full")
    line = error_line(run("-m", str(model), "--moe-stream", "--cache-mb", "0", "-n", "2", "-t", "1", flag,
                          "/dev/full"), 2, f"{flag} /dev/full: is a character device, not a file")
    assert "give a file path" in line
    after = os.stat("/dev/full")
    assert (after.st_mode, after.st_rdev, after.st_ino) == (before.st_mode, before.st_rdev, before.st_ino)


@pytest.fixture
def tmpfs(tmp_path):
    yield from mount_tmpfs(tmp_path)


@pytest.mark.parametrize("flag", [*OUTPUTS, "--fidelity-ref"])
def test_an_output_on_a_full_disk_names_the_flag_and_path(model, tmpfs, flag):
    out = tmpfs / "out.csv"
    fill(tmpfs)
    argv = ["-c", "64", "-p", TEXT] if flag == "--fidelity-ref" else ["--moe-stream", "--cache-mb", "0", "-n", "8"]
    line = error_line(run("-m", str(model), "-t", "1", *argv, flag, str(out)), 28, f"{flag} {out}: disk full")
    assert "No space" not in line
    assert sorted(p.name for p in tmpfs.iterdir()) in (["filler"], ["filler", "out.csv"])


@pytest.mark.parametrize("flag", [*OUTPUTS, "--fidelity-ref"])
def test_an_output_in_a_read_only_folder_names_the_flag_and_path(model, tmp_path, flag):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    argv = ["-c", "64", "-p", TEXT] if flag == "--fidelity-ref" else ["--moe-stream", "--cache-mb", "0", "-n", "2"]
    try:
        error_line(run("-m", str(model), "-t", "1", *argv, flag, str(ro / "out.csv"), prefix=AS_USER), 2,
                   f"{flag} {ro / 'out.csv'}: cannot write it", "Permission denied")
        assert list(ro.iterdir()) == []
    finally:
        ro.chmod(0o755)
