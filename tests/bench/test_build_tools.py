"""harness/deploy/build_tools.py: the build tools come from pyproject.toml's [build-system] (declared once), and an old
setuptools (a fresh venv's 65) or a missing wheel is named, as setup.sh and deploy need."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from harness.deploy import build_tools

ROOT = Path(__file__).resolve().parents[2]


def test_requires_is_pyprojects_build_system():
    want = tomllib.loads((ROOT / "pyproject.toml").read_text())["build-system"]["requires"]
    assert build_tools.requires() == want and any(r.startswith("setuptools>=") for r in want)


@pytest.mark.parametrize(("have", "bad"), [
    ({"setuptools": "84.2.1", "wheel": "0.45.1"}, []),
    ({"setuptools": "77.0.0", "wheel": "0.45.1"}, []),
    ({"setuptools": "65.5.0", "wheel": "0.45.1"}, ["setuptools>=77 (have 65.5.0)"]),
    ({"setuptools": "84.2.1"}, ["wheel (have none)"]),
    ({}, ["setuptools>=77 (have none)", "wheel (have none)"]),
])
def test_unmet_names_what_is_missing_or_too_old(have, bad):
    assert build_tools.unmet(["setuptools>=77", "wheel"], have) == bad


def test_a_requirement_of_another_form_is_refused():
    with pytest.raises(ValueError, match="not NAME or NAME>=VERSION"):
        build_tools.unmet(["setuptools~=77.0"], {})


def test_the_module_prints_them_and_says_by_its_exit_status(tmp_path):
    fresh = tmp_path / "v"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(fresh)], check=True)
    r = subprocess.run([str(fresh / "bin" / "python"), "-m", "harness.deploy.build_tools"], cwd=ROOT,
                       capture_output=True, text=True)
    assert r.stdout.split() == build_tools.requires() and r.returncode == 1, r.stderr  # a bare venv has neither
    here = subprocess.run([sys.executable, "-m", "harness.deploy.build_tools"], cwd=ROOT, capture_output=True,
                          text=True)
    assert here.returncode == 0, "the suite's own venv lacks a build tool: run scripts/setup.sh"
