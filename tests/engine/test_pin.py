"""`bmoe --version` names the llama-cpp-python version pyproject.toml pins, read back from the installed
metadata (harness.engine.model.pin), not a second copy of it."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

from harness import __version__
from harness.engine.model.pin import pinned_version

REPO = Path(__file__).resolve().parents[2]


def _pyproject_pin() -> str:
    deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    (pin,) = [d.split("==", 1)[1].strip() for d in deps if d.startswith("llama-cpp-python")]
    return pin


def test_the_installed_pin_is_pyprojects():
    assert pinned_version() == _pyproject_pin(), "reinstall bmoe (pip install -e .) after changing the pin"


def test_requirement_lines():
    assert pinned_version(["numpy>=1.26", "llama-cpp-python==0.3.36"]) == "0.3.36"
    assert pinned_version(["llama_cpp_python == 0.4.1 ; python_version >= '3.11'"]) == "0.4.1"
    assert pinned_version(["llama-cpp-python>=0.3"]) is None  # not an exact pin
    assert pinned_version([]) is None


def test_version_line():
    out = subprocess.run([sys.executable, "-m", "harness.engine.cli", "--version"], capture_output=True, text=True,
                         cwd=REPO, check=True).stdout
    assert out == f"bmoe {__version__} (llama-cpp-python {_pyproject_pin()} pinned)\n"
