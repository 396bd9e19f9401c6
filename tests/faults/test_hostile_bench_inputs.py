"""Hostile input to `bmoe-bench` (issue 36): a campaign asking the engine for --help (it printed the help, exit 0,
no folder), a name too long for its folder (ENAMETOOLONG traceback), a prompt no command line holds (it validated,
then every run and resume failed with E2BIG and stayed pending for ever), a model that is not a regular file
(/proc/self/mem: an EIO traceback), and destinations that cannot be written (`merge --out`, `make-model`: read-only,
full, a device). Each is one `Error:` line naming the input, a non-zero exit, no traceback, nothing made elsewhere.
Real processes, a real tmpfs filled up, a real FIFO."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.helpers.faults import cli, error_line, fill, folders, mount_tmpfs
from tests.helpers.runner import BENCH, campaign

_CAPS = "-dac_override,-dac_read_search,-fowner"
AS_USER = ("setpriv", f"--inh-caps={_CAPS}", f"--bounding-set={_CAPS}") if os.geteuid() == 0 else ()


def as_user(*args: object) -> subprocess.CompletedProcess:
    """bmoe-bench ARGS as a real process without root's way past file permissions."""
    return subprocess.run([*AS_USER, *BENCH, *map(str, args)], capture_output=True, text=True, timeout=300)


def refused(tmp_path: Path, p: Path, *argv: str, needles: tuple[str, ...]) -> None:
    """validate and run both refuse with one line; run makes no folder."""
    out = tmp_path / "bd"
    for args in (("validate", p, *argv), ("run", p, "--out", out, *argv)):
        r = cli(*args)
        assert r.returncode == 2, (r.stdout, r.stderr)
        line = error_line(r.stderr)
        for n in needles:
            assert n in line, line
    assert folders(out) == [] and not any(out.glob(".*")) if out.exists() else True


def _bmoe_campaign(tmp_path: Path) -> Path:
    """A campaign of the bmoe engine (validation parses its flags with the engine's own parser)."""
    p = campaign(tmp_path, repeats=1)
    text = p.read_text().replace(f"engine: {{kind: external, path: {tmp_path / 'fake-engine'}}}\n", "")
    p.write_text(text.replace("flags: {--speed: 10, --sleep-ms: 0}", "flags: {-t: 1}")
                 .replace("- flag: --speed", "- flag: -t").replace("values: [20]", "values: [2]"))
    return p


@pytest.mark.parametrize("flag", ["--help", "-h", "--version", "--list-archs"])
def test_an_engine_flag_that_prints_and_exits_is_refused(tmp_path, flag):
    p = _bmoe_campaign(tmp_path)
    assert cli("validate", p).returncode == 0, cli("validate", p).stderr
    refused(tmp_path, p, "--set", f"flags.{flag}=true", needles=(f"{flag} prints something and exits",))


def test_a_name_too_long_for_its_folder_is_refused(tmp_path):
    p = campaign(tmp_path, repeats=1)
    refused(tmp_path, p, "--set", "name=" + "a" * 240, needles=("name is 240 characters", "at most 120"))


def test_a_prompt_no_command_line_holds_is_refused_at_validate(tmp_path):
    p = campaign(tmp_path, repeats=1)
    p.write_text(p.read_text() + 'prompt: "' + "x" * 200_000 + '"\n')
    refused(tmp_path, p, needles=(f"{p}:13: prompt is 200,000 bytes", "at most 120,000"))
    # a prompt of 100,000 characters still runs, every run ends
    p.write_text(campaign(tmp_path, repeats=1).read_text() + 'prompt: "' + "y" * 100_000 + '"\n')
    r = cli("run", p, "--out", tmp_path / "ok")
    assert r.returncode == 0, r.stderr


@pytest.mark.parametrize("path,what", [("/proc/self/mem", "cannot be read (Input/output error)"),
                                       ("/dev/zero", "is not a regular file"), ("FIFO", "is not a regular file")])
def test_a_model_that_is_not_a_regular_file_is_refused(tmp_path, path, what):
    if path == "FIFO":
        path = str(tmp_path / "model.fifo")
        os.mkfifo(path)
    p = campaign(tmp_path, repeats=1)
    refused(tmp_path, p, "--set", f"model.path={path}", needles=(f"model.path {path} {what}",))


@pytest.fixture
def tmpfs(tmp_path):
    yield from mount_tmpfs(tmp_path)


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("fin")
    r = cli("run", campaign(d, repeats=1), "--out", d / "bd")
    assert r.returncode == 0, r.stderr
    return folders(d / "bd")[0]


@pytest.mark.skipif(not AS_USER and os.geteuid() == 0, reason="needs setpriv")
def test_merge_into_a_read_only_folder_is_one_line(finished, tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    try:
        r = as_user("merge", finished, "--out", ro / "m")
        assert r.returncode == 2, r.stderr
        assert f"--out {ro / 'm'}: cannot write" in error_line(r.stderr)
        assert list(ro.iterdir()) == []
    finally:
        ro.chmod(0o755)


def test_merge_onto_a_full_disk_is_one_line_and_leaves_nothing(finished, tmpfs):
    filler = fill(tmpfs, leave=16 * 1024)
    r = cli("merge", finished, "--out", tmpfs / "m")
    assert r.returncode == 28, r.stderr
    line = error_line(r.stderr)
    assert f"{tmpfs / 'm'}" in line and "disk full" in line, line
    assert sorted(x.name for x in tmpfs.iterdir()) == [filler.name]


def test_make_model_into_a_read_only_folder_is_one_line(tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    try:
        r = as_user("make-model", ro / "m.gguf")
        assert r.returncode == 2, r.stderr
        assert f"{ro}: cannot write m.gguf there" in error_line(r.stderr)
        assert list(ro.iterdir()) == []
    finally:
        ro.chmod(0o755)


def test_make_model_onto_a_full_disk_or_a_device_is_one_line(tmpfs):
    r = cli("make-model", tmpfs / "m.gguf")
    assert r.returncode == 28, r.stderr
    assert f"{tmpfs / 'm.gguf'}: disk full (needs 7.1 MiB" in error_line(r.stderr)
    assert list(tmpfs.iterdir()) == []  # no half-written .part
    for force in ((), ("--force",)):
        r = cli("make-model", "/dev/full", *force)
        assert r.returncode == 2 and "/dev/full" in error_line(r.stderr)
    assert not Path("/dev/full.part").exists()


@pytest.mark.skipif(not AS_USER and os.geteuid() == 0, reason="needs setpriv")
def test_report_on_a_read_only_folder_is_one_line_and_writes_nothing(finished, tmp_path):
    import shutil

    ro = tmp_path / finished.name
    shutil.copytree(finished, ro)
    shutil.rmtree(ro / "plots")
    (ro / "findings.md").unlink()
    before = sorted(p.relative_to(ro) for p in ro.rglob("*"))
    for p in [ro, *ro.rglob("*")]:
        if p.is_dir():
            p.chmod(0o555)
    try:
        r = as_user("report", ro)
        assert r.returncode == 2, r.stderr
        assert f"{ro}: cannot write" in error_line(r.stderr)
        assert sorted(p.relative_to(ro) for p in ro.rglob("*")) == before
    finally:
        for p in [ro, *ro.rglob("*")]:
            if p.is_dir():
                p.chmod(0o755)
