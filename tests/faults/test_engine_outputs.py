"""Output paths checked before the model loads: a PATH flag that writes, into a directory that does not exist (or
that is a file), is one line and exit 2 from a real `bmoe`, and nothing is created (before, `--csv` made the
missing directory and the traces failed after the load with exit 3)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from harness.engine.config import SPECS
from harness.formats.replies import PromptItem, write_prompts
from harness.synth import ModelSpec, make_model
from tests.helpers.engine import BMOE

pytestmark = pytest.mark.engine

# each writing flag with what it needs beside it
NEEDS = {"--csv": (), "--replies": ("--prompts-file",), "--route-trace": ("--moe-stream",),
         "--io-trace": ("--moe-stream",), "--compute-trace": ("--moe-stream",)}


def test_every_writing_flag_is_covered_here():
    assert sorted(s.label for s in SPECS if s.flag.writes) == sorted(NEEDS)


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    return make_model(tmp_path_factory.mktemp("outmodel") / "m.gguf", ModelSpec(expert_type="q8_0", seed=5))[0]


def _bmoe(model: Path, tmp: Path, flag: str, path: Path) -> subprocess.CompletedProcess:
    argv = [*BMOE, "-m", str(model), "-p", "hi", "-n", "2", "-t", "1", flag, str(path)]
    for need in NEEDS[flag]:
        argv.append(need)
        if need == "--prompts-file":
            write_prompts(tmp / "p.jsonl", [PromptItem(id="a", prompt="hi")])
            argv.append(str(tmp / "p.jsonl"))
    return subprocess.run(argv, capture_output=True, text=True, errors="replace", timeout=300)


@pytest.mark.parametrize("flag", list(NEEDS))
def test_a_missing_directory_is_one_line_exit_2_and_nothing_created(model, tmp_path, flag):
    gone = tmp_path / "missing" / "deeper"
    p = _bmoe(model, tmp_path, flag, gone / "out.csv")
    lines = [x for x in p.stderr.splitlines() if x.strip()]
    assert p.returncode == 2 and len(lines) == 1 and "Traceback" not in p.stderr, p.stderr
    assert flag in lines[0] and f"{gone} does not exist" in lines[0], lines[0]
    assert p.stdout == "" and not (tmp_path / "missing").exists()


@pytest.mark.parametrize("flag", ["--csv", "--io-trace"])
def test_a_file_as_directory_or_a_directory_as_file_is_one_line(model, tmp_path, flag):
    f = tmp_path / "plain"
    f.write_text("x")
    p = _bmoe(model, tmp_path, flag, f / "out.csv")
    assert p.returncode == 2 and f"{f} is not a directory" in p.stderr and f.read_text() == "x", p.stderr
    p = _bmoe(model, tmp_path, flag, tmp_path)
    assert p.returncode == 2 and "is a directory" in p.stderr, p.stderr
