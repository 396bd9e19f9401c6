"""The ARM run's plan (tests/helpers/arm_gates.py, run by scripts/arm-gates.sh in an arm64 root file system): every
architecture the registry lists as covered has gates in it, from the module that covers it; every node id names a
test pytest collects; and the table of a run is counted from a real pytest run's JUnit XML."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from harness.engine.model.registry import COVERED
from tests.helpers.arm_gates import BY_ARCH, KNOBS, SMOKE, main, nodes, read_junit, summarize, table

REPO = Path(__file__).resolve().parents[2]


def test_every_covered_architecture_has_gates_from_its_own_module() -> None:
    assert set(BY_ARCH) == {c.arch for c in COVERED}
    for c in COVERED:
        assert any(n.startswith(f"{c.gate}::") for n in BY_ARCH[c.arch]), (c.arch, c.gate)
    assert set(nodes(smoke=True)) <= set(nodes())
    assert len(nodes()) == len(set(nodes())) == sum(len(v) for v in {**BY_ARCH, **KNOBS}.values())
    assert list(SMOKE) == ["olmoe"]


def test_every_node_id_is_a_test_pytest_collects() -> None:
    ids = nodes()
    p = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *ids],
                       cwd=REPO, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-2000:]
    collected = [ln for ln in p.stdout.splitlines() if "::" in ln]
    assert sorted(collected) == sorted(ids), set(ids) ^ set(collected)


def test_the_table_counts_a_real_junit_report(tmp_path: Path, capsys) -> None:
    (tmp_path / "test_x.py").write_text(
        "import pytest\n"
        "def test_ok(): pass\n"
        "def test_bad(): assert 1 == 2\n"
        "@pytest.mark.parametrize('a', ['p', 'q'])\n"
        "def test_par(a): pytest.skip('no') if a == 'q' else None\n")
    xml = tmp_path / "junit.xml"
    subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={xml}",
                    "--rootdir", str(tmp_path), "test_x.py"], cwd=tmp_path, capture_output=True, timeout=120)
    cases = read_junit(xml.read_text())
    assert {c.node: c.outcome for c in cases} == {"test_x.py::test_ok": "passed", "test_x.py::test_bad": "failed",
                                                  "test_x.py::test_par[p]": "passed",
                                                  "test_x.py::test_par[q]": "skipped"}
    plan = {"a": ("test_x.py::test_ok", "test_x.py::test_bad"),
            "b": ("test_x.py::test_par[p]", "test_x.py::test_par[q]", "test_x.py::test_never")}
    rows = summarize(cases, plan)
    assert [(r.group, r.count("passed"), r.count("failed"), r.count("skipped")) for r in rows] == [
        ("a", 1, 1, 0), ("b", 1, 0, 1)]
    text = table(rows, plan).splitlines()
    assert text[2].startswith("| `a` | 2 | 1 | 1 | 0 | 0 |") and text[3].startswith("| `b` | 3 | 1 | 0 | 1 | 1 |")
    assert text[-2:] == ["Failed:", "- `test_x.py::test_bad`"]


def test_a_missing_report_is_one_line_and_exit_2(tmp_path: Path, capsys) -> None:
    assert main(["--summarize", str(tmp_path / "nope.xml")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "nope.xml: no such file" in err[0]


def test_the_script_parses_and_says_what_it_needs() -> None:
    script = REPO / "scripts" / "arm-gates.sh"
    assert subprocess.run(["bash", "-n", str(script)], capture_output=True).returncode == 0
    p = subprocess.run(["bash", str(script), "--help"], capture_output=True, text=True, timeout=30)
    assert p.returncode == 0 and "arm-gates.sh" in p.stdout and "--smoke" in p.stdout
    p = subprocess.run(["bash", str(script), "--bogus"], capture_output=True, text=True, timeout=30)
    assert p.returncode == 2 and p.stderr.strip().splitlines() == ["arm-gates: unknown option --bogus; see --help"]
    # not root: refused before anything is installed, mounted or downloaded (as root: dropped to nobody, who is
    # given the script on its standard input, as the clone may be in a folder nobody cannot read)
    drop = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"] if os.geteuid() == 0 else []
    p = subprocess.run([*drop, "bash", "-s", "--", "--smoke"], input=script.read_text(), cwd="/",
                       capture_output=True, text=True, timeout=30)
    assert p.returncode == 1 and p.stderr.strip().splitlines() == [
        "arm-gates: needs root (debootstrap, chroot, mounts, binfmt_misc): run it as root"]


def test_each_modules_gates_run_together() -> None:
    """A module's fixtures (its generated models) are set up once only if its tests are not split by another's."""
    modules = [n.split("::")[0] for n in nodes()]
    assert all(m not in modules[:i] or modules[i - 1] == m for i, m in enumerate(modules)), modules
