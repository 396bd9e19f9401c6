"""A fixed cache that cannot fit under the memory cgroup's limit: refused at load with one line naming the largest
budget that fits (and that budget runs), a warning with --force-cache; and a run the kernel's OOM killer ends is
reported as such by the engine's parent: the capped CLI and the harness's local target (real cgroups: root)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from harness.engine.cache.budget import MIB, CapFit
from harness.synth import ModelSpec, make_model
from harness.targets.local import LocalTarget
from tests.helpers.engine import BMOE

CAP = 128  # MiB: the wide model's ~100 MiB of experts cannot all be cached under it beside the runtime (OOM-killed)
ROOM = 160  # MiB: some cache fits beside the runtime (not all 110 MiB: the fit check says 166 are needed)


def _cgroups() -> str | None:
    from harness.errors import UserError
    from harness.targets.cgroup import CappedCgroup, locate_self

    try:
        with CappedCgroup(locate_self(), 64):
            return None
    except (UserError, OSError) as e:
        return str(e)


needs_cgroup = pytest.mark.skipif(_cgroups() is not None, reason="no usable memory cgroup here")


def test_the_fit_and_its_lines():
    fit = CapFit(limit=448 * MIB, dense=139 * MIB, budget=300 * MIB, resident=67 * MIB, compute=36 * MIB,
                 release=30 * MIB)
    assert fit.runtime == 133 * MIB and fit.need == 572 * MIB and fit.largest_budget == 176 * MIB
    line = fit.problem(force=False)
    assert line is not None and line.startswith(
        "--cache-mb 300 cannot fit: dense weights 139 MiB (anonymous) + cache 300 MiB + runtime 133 MiB")
    assert "limit of 448 MiB; --cache-mb 176 is the largest that fits" in line and "\n" not in line
    warn = fit.problem(force=True)
    assert warn is not None and warn.startswith("bmoe: warning: --cache-mb 300 will not fit")
    assert "--force-cache" in warn
    assert CapFit(448 * MIB, 139 * MIB, 176 * MIB, 67 * MIB, 36 * MIB, 30 * MIB).problem(force=False) is None
    none = CapFit(200 * MIB, 139 * MIB, 50 * MIB, 67 * MIB, 0, 0).problem(force=False)
    assert none is not None and "no cache fits (--cache-mb 0)" in none
    # a budget under one layer's experts: the rest of that layer counts too, and no budget fits below the layer
    small = CapFit(128 * MIB, 4 * MIB, 23 * MIB, 61 * MIB, 27 * MIB, 13 * MIB, layer=24 * MIB)
    assert small.burst == 1 * MIB and small.need == 129 * MIB and small.largest_budget == 0
    line = small.problem(force=False)
    assert line is not None and "1 of a prompt layer beyond the cache" in line and "no cache fits" in line
    roomy = CapFit(192 * MIB, 4 * MIB, 100 * MIB, 61 * MIB, 27 * MIB, 13 * MIB, layer=24 * MIB)
    assert roomy.burst == 0 and roomy.largest_budget == 87 * MIB


@pytest.fixture(scope="module")
def wide(tmp_path_factory) -> Path:
    """~100 MB, nearly all experts: 4 layers x 32 Q8_0 experts of 256x1024."""
    return make_model(tmp_path_factory.mktemp("cap") / "wide.gguf",
                      ModelSpec(n_expert=32, n_expert_used=4, n_ff_exp=1024, expert_type="q8_0", seed=11))[0]


def _capped(model: Path, *flags: str, n: int = 8, cap: int = CAP) -> subprocess.CompletedProcess:
    argv = [sys.executable, "-m", "harness.targets.capped", "--mem-mib", str(cap), "--", *BMOE, "-m", str(model),
            "-p", "Stream every expert of the wide model through the cache.", "-n", str(n), "-t", "1",
            "--moe-stream", *flags]
    return subprocess.run(argv, capture_output=True, text=True, errors="replace", timeout=300)


def _lines(p: subprocess.CompletedProcess, prefix: str) -> list[str]:
    return [x for x in p.stderr.splitlines() if x.startswith(prefix)]


@needs_cgroup
def test_a_cache_over_the_limit_is_refused_naming_a_budget_that_runs(wide):
    p = _capped(wide, "--cache-mb", "110", cap=ROOM)
    err = _lines(p, "bmoe: ")
    assert p.returncode == 2 and len(err) == 1 and "Traceback" not in p.stderr, p.stderr
    m = re.search(rf"--cache-mb 110 cannot fit: .* limit of {ROOM} MiB; --cache-mb (\d+) is the largest that fits",
                  err[0])
    assert m, err[0]
    fits = int(m.group(1))
    assert 0 < fits < 110
    assert _capped(wide, "--cache-mb", "0", cap=CAP).returncode == 0  # no cache: nothing to refuse
    ok = _capped(wide, "--cache-mb", str(fits), "--force-cache", n=48, cap=ROOM)  # forced past the token-cycle guard
    assert ok.returncode == 0 and not _lines(ok, "bmoe: warning: --cache-mb"), ok.stderr[-800:]
    assert "cannot fit" not in ok.stderr


@needs_cgroup
def test_forced_it_warns_then_the_oom_kill_is_reported_by_the_parent(wide, tmp_path):
    p = _capped(wide, "--cache-mb", "100", "--force-cache", n=48)
    assert len(_lines(p, "bmoe: warning: --cache-mb 100 will not fit")) == 1, p.stderr[-800:]
    assert p.returncode == 137, p.stderr[-800:]
    said = _lines(p, "capped: ")
    assert len(said) == 1 and "was killed by the kernel's OOM killer under the 128 MiB cap (cgroup memory." in said[0]
    # the harness's runner, the engine's parent in a campaign: the run's reason says so
    t = LocalTarget(mem_cap_mib=CAP)
    try:
        out = t.run([*BMOE, "-m", str(wide), "-p", "Stream every expert of the wide model through the cache.",
                     "-n", "48", "-t", "1", "--moe-stream", "--cache-mb", "100", "--force-cache"],
                    timeout_s=300, outputs=[], out_dir=tmp_path / "o", log_path=tmp_path / "o" / "engine.log")
    finally:
        t.close()
    assert out.oom_killed and not out.ok
    assert out.reason is not None and out.reason.startswith("killed by the kernel's OOM killer under the 128 MiB cap")
