"""The parts of the SSH target and of `bmoe-bench deploy` that need no sshd: the campaign keys and their rules, the
harness's version and source archive, the stamp's comparison and the run's refusal, whether a target can run
the harness's own binaries, and wheels packed from this environment (installed by pip to check them)."""

from __future__ import annotations

import subprocess
import sys
import tarfile
import tomllib
import zipfile
from importlib import metadata
from pathlib import Path

import pytest

from harness.campaigns.provenance import LLAMA_CPP_PYTHON as PROVENANCE_PIN
from harness.commands.deploy import target_spec
from harness.deploy.stamp import (
    LLAMA_CPP_PYTHON,
    differences,
    harness_version,
    run_refusal,
    source_archive,
    source_root,
    wanted_stamp,
)
from harness.deploy.wheels import cpu_flags, incompatibility, pack, runtime_closure
from harness.errors import UserError
from harness.formats.campaign import CampaignFile, TargetSpec


def _problems(target: dict, engine: object = "bmoe") -> list[str]:
    c = CampaignFile.model_validate({"name": "x", "model": {"recipe": {"shape": "tiny"}}, "target": target,
                                     "engine": engine})
    return [m for _, m in c.relation_problems()]


def test_ssh_and_termux_targets_and_their_rules():
    assert _problems({"kind": "ssh", "host": "board", "user": "me", "identity_file": "~/.ssh/id"}) == []
    assert _problems({"kind": "termux", "serial": "abc", "identity_file": "k"}) == []
    assert _problems({"kind": "ssh"}) == ["target ssh needs host (and port, user, identity_file as ssh needs them)"]
    assert _problems({"kind": "local", "host": "h"}) == ["target.host is for target ssh or termux"]
    assert _problems({"kind": "termux", "host": "h"})[0].startswith("target termux is reached at 127.0.0.1")
    assert _problems({"kind": "ssh", "host": "h", "mem_cap_mib": 100}) == [
        "mem_cap_mib and drop_caches apply to target local only"]
    assert any("over adb use" in m for m in _problems({"kind": "adb"}))  # bmoe runs on ssh, not over adb


def test_a_local_or_adb_target_records_and_hashes_as_before():
    for kind in ("local", "adb"):
        full = TargetSpec.model_validate(TargetSpec(kind=kind).model_dump())  # as the plan record makes it
        assert set(full.model_dump()) == {"kind", "serial", "mem_cap_mib", "drop_caches", "evict_model"}
    ssh = TargetSpec(kind="ssh", host="h", port=2222)
    assert ssh.model_dump()["host"] == "h" and "user" not in ssh.model_dump()


def test_the_pin_is_pyproject_s():
    deps = tomllib.loads((source_root() / "pyproject.toml").read_text())["project"]["dependencies"]
    assert f"llama-cpp-python=={LLAMA_CPP_PYTHON}" in deps and PROVENANCE_PIN == LLAMA_CPP_PYTHON


def test_the_source_archive_is_the_hashed_files_and_the_same_bytes_twice(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    a, b = source_archive(tmp_path / "a"), source_archive(tmp_path / "b")
    assert a.read_bytes() == b.read_bytes() and a.name == "bmoe-0.1.0.tar.gz"
    names = tarfile.open(a).getnames()
    top = "bmoe-0.1.0"
    assert f"{top}/pyproject.toml" in names and f"{top}/harness/deploy/stamp.py" in names
    assert not [n for n in names if "__pycache__" in n or n.endswith(".so")]
    version, _, src = harness_version().partition("+src.")
    assert version == "0.1.0" and len(src) == 12 and int(src, 16) >= 0


def test_the_stamp_comparison_and_the_run_refusal():
    want = wanted_stamp("3.11.2", False)
    assert differences(None, want) == ["not deployed"]
    assert differences({**want, "deployed": "yesterday"}, want) == []
    assert differences({**want, "bmoe": "0.1.0+src.000000000000"}, want) == [
        f"bmoe: '0.1.0+src.000000000000' -> '{harness_version()}'"]
    assert run_refusal(None, "me@b:22", "/d", "bmoe-bench deploy c.yaml") == (
        "ssh target me@b:22: bmoe is not deployed in /d (no deploy.json); run `bmoe-bench deploy c.yaml`")
    old = '{"bmoe": "0.1.0+src.000000000000"}'
    assert run_refusal(old, "me@b:22", "/d", "bmoe-bench deploy c.yaml") == (
        f"ssh target me@b:22: bmoe 0.1.0+src.000000000000 is deployed in /d, the harness is {harness_version()}; "
        "run `bmoe-bench deploy c.yaml`")
    assert run_refusal(f'{{"bmoe": "{harness_version()}"}}', "me@b:22", "/d", "x") is None


def test_which_targets_can_run_the_harness_s_binaries():
    host = {"soabi": "cpython-311-x86_64-linux-gnu", "machine": "x86_64", "libc": ["glibc", "2.36"]}
    assert incompatibility(host, {**host, "libc": ["glibc", "2.40"]}, {"avx2", "sse4_2"}, {"avx2", "sse4_2", "x"}) \
        is None
    arm = {"soabi": "cpython-312-aarch64-linux-android", "machine": "aarch64", "libc": ["", ""]}
    assert incompatibility(host, arm, set(), set()).startswith("Python ABI cpython-312-aarch64-linux-android there")
    assert incompatibility(host, {**host, "libc": ["glibc", "2.31"]}, set(), set()) == \
        "libc glibc 2.31 there, glibc 2.36 here"
    assert incompatibility(host, host, {"avx512f", "avx2"}, {"avx2"}) == "the target's CPU lacks avx512f"
    assert cpu_flags("processor: 0\nflags\t\t: fpu sse2 avx2\n") == {"fpu", "sse2", "avx2"}
    assert cpu_flags("Features\t: fp asimd aes\n") == {"fp", "asimd", "aes"}


def test_deploy_targets_on_the_command_line():
    t = target_spec("me@board:2222", identity_file="~/.ssh/k", known_hosts=None, dir=None)
    assert (t.kind, t.host, t.port, t.user, t.identity_file) == ("ssh", "board", 2222, "me", "~/.ssh/k")
    assert target_spec("board", identity_file=None, known_hosts=None, dir="/d").model_dump() == {
        "kind": "ssh", "serial": None, "mem_cap_mib": None, "drop_caches": False, "evict_model": True, "host": "board",
        "dir": "/d"}
    assert (target_spec("termux:R5C", identity_file=None, known_hosts=None, dir=None).serial) == "R5C"
    with pytest.raises(UserError, match="give a campaign file"):
        target_spec("board:x", identity_file=None, known_hosts=None, dir=None)


def test_the_runtime_closure_and_a_packed_wheel_that_pip_installs(tmp_path):
    names = {d.metadata["Name"].lower().replace("_", "-") for d in runtime_closure()}
    assert {"llama-cpp-python", "numpy", "pydantic", "typer", "setuptools"} <= names and "bmoe" not in names
    dist = metadata.distribution("typer")
    whl = pack(dist, tmp_path / "cache")
    assert pack(dist, tmp_path / "cache") == whl  # cached
    with zipfile.ZipFile(whl) as z:
        record = z.read(next(n for n in z.namelist() if n.endswith(".dist-info/RECORD"))).decode()
        assert "typer/__init__.py,sha256=" in record and not [n for n in z.namelist() if n.startswith("..")]
    p = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index", "--target",
                        str(tmp_path / "site"), str(whl)], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    assert (tmp_path / "site" / "typer" / "__init__.py").read_bytes() == \
        Path(str(dist.locate_file("typer/__init__.py"))).read_bytes()
