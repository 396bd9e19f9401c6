"""Bad input at the command line: each a one-line error naming the problem, a non-zero exit, and no traceback.
Flag refusals need no model and no subprocess: test_engine_config.py."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from harness.synth import ModelSpec, make_model
from tests.helpers.engine import BMOE

pytestmark = pytest.mark.engine


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("errmodels")
    return make_model(d / "tiny.gguf", ModelSpec(expert_type="q4_k", seed=11))[0]


def run(*argv: str, prefix: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    return subprocess.run(list(prefix) + BMOE + list(argv), capture_output=True, text=True, errors="replace",
                          timeout=300)


def one_line_error(p: subprocess.CompletedProcess, *needles: str) -> str:
    assert p.returncode != 0
    assert "Traceback" not in p.stderr
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, p.stderr
    for n in needles:
        assert n in lines[0], lines[0]
    return lines[0]


def test_missing_file(tmp_path):
    one_line_error(run("-m", str(tmp_path / "nope.gguf"), "--moe-stream"), "nope.gguf", "no such model file")


def test_truncated_gguf(model, tmp_path):
    cut = tmp_path / "cut.gguf"
    with open(model, "rb") as f, open(cut, "wb") as g:
        g.write(f.read(model.stat().st_size // 2))
    one_line_error(run("-m", str(cut), "--moe-stream"), "cut.gguf", "truncated")
    head = tmp_path / "head.gguf"
    with open(model, "rb") as f, open(head, "wb") as g:
        g.write(f.read(300))
    one_line_error(run("-m", str(head), "--moe-stream"), "head.gguf", "truncated")


def test_missing_shard(tmp_path):
    paths = make_model(tmp_path / "s.gguf", ModelSpec(expert_type="q4_k", seed=12, n_split=3))
    paths[1].unlink()
    one_line_error(run("-m", str(paths[0]), "--moe-stream"), "missing shard 2 of 3")


def test_dense_model(tmp_path):
    p = make_model(tmp_path / "dense.gguf", ModelSpec(arch="qwen3", dense_type="f32", seed=13))[0]
    one_line_error(run("-m", str(p), "--moe-stream"), "dense model", "qwen3moe")


def test_unsupported_arch(tmp_path):
    """An architecture llama.cpp cannot load, and one whose experts are laid out in a way bmoe does not know."""
    from tests.helpers.gguf import header_only as _header_only

    p = _header_only(tmp_path / "x.gguf", "notanarch", [("blk.0.ffn_gate_exps.weight", (32, 32, 8))])
    one_line_error(run("-m", str(p), "--moe-stream"), "'notanarch' is not one the pinned llama.cpp can load",
                   "qwen2moe, qwen35moe, qwen3moe", "bmoe --list-archs")
    p = _header_only(tmp_path / "y.gguf", "olmoe", [("blk.0.ffn_w13_exps.weight", (32, 64, 8))])
    one_line_error(run("-m", str(p), "--moe-stream"), "expert layout bmoe does not know", "ffn_gate_exps")


def test_budget_below_token_cycle(tmp_path):
    # tiny F32: an expert is 3 x 256 x 256 x 4 B = 0.75 MiB; T = 4 layers x k=2 x 0.75 MiB = 6 MiB
    p = make_model(tmp_path / "f32.gguf", ModelSpec(expert_type="f32", seed=15))[0]
    line = one_line_error(run("-m", str(p), "--moe-stream", "--cache-mb", "1"), "below one token cycle",
                          "--force-cache")
    assert "T = 6 MiB" in line and "give at least 6 MiB" in line
    at_t = run("-m", str(p), "--moe-stream", "--cache-mb", "6", "-n", "4")
    assert at_t.returncode == 0, at_t.stderr
    ok = run("-m", str(p), "--moe-stream", "--cache-mb", "1", "--force-cache", "-n", "4")
    assert ok.returncode == 0, ok.stderr


def test_n_expert_used_above_count(model):
    one_line_error(run("-m", str(model), "--moe-stream", "--n-expert-used", "9"), "--n-expert-used 9",
                   "8 experts")


def test_unreadable_model(model, tmp_path):
    p = tmp_path / "m.gguf"
    shutil.copy(model, p)
    os.chmod(p, 0o000)
    prefix: tuple[str, ...] = ()
    if os.geteuid() == 0:  # root reads anything: drop the capabilities that bypass file permissions
        caps = "-dac_override,-dac_read_search"
        prefix = ("setpriv", f"--inh-caps={caps}", f"--bounding-set={caps}")
    one_line_error(run("-m", str(p), "--moe-stream", prefix=prefix), "permission denied", "m.gguf")


@pytest.mark.parametrize("damage", ["used-0", "used-above-count", "used-missing"])
def test_a_bad_expert_used_count_is_one_line_before_llama_cpp(model, tmp_path, damage):
    """llama.cpp asserts on these (exit 134, a gdb backtrace on stdout): refused from the header first, by `bmoe`
    and by `bmoe serve`, exit 2, nothing on stdout."""
    from tests.helpers.gguf import with_kv

    key = "qwen3moe.expert_used_count"
    bad = tmp_path / f"{damage}.gguf"
    if damage == "used-missing":
        with_kv(model, bad, key, rename=key.replace("count", "cOunt"))
        needles = (f"no {key}",)
    else:
        value = 0 if damage == "used-0" else 9
        with_kv(model, bad, key, value)
        needles = (f"{key} is {value}", "outside 1..8")
    for sub in ((), ("serve", "--port", "0")):
        p = run(*sub, "-m", str(bad), "-p", "hi", "-n", "2")
        assert p.returncode == 2 and p.stdout == "", (p.returncode, p.stdout[-400:])
        one_line_error(p, str(bad), *needles)
