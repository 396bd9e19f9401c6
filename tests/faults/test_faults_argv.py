"""Strings that cannot reach a process: a NUL byte (or a lone surrogate) anywhere in a campaign file, in the prompt,
a flag value, a path or the quality template, is one line naming the file, the key's line and the key, from
`validate` and from `run` (before, `validate` passed it and every `run` and resume died with `ValueError: embedded
null byte`); the local target itself turns such an argument into one line."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from harness.errors import UserError
from harness.targets.local import LocalTarget
from tests.helpers.faults import bench, cli, error_line, folders, held, start
from tests.helpers.runner import campaign, wait_for

# (what to add or change in the small campaign, the key named, the line of that key)
CASES = {
    "prompt": (lambda t: t + 'prompt: "hello\\0world"\n', "prompt", 13),
    "flag-value": (lambda t: t.replace("--sleep-ms: 0}", '--sleep-ms: 0, --tag: "a\\0b"}'), "flags --tag", 4),
    "axis-value": (lambda t: t.replace("values: [20]", 'values: [20, "2\\x000"]'), "axes[0].values[1]", 12),
    "model-path": (lambda t: t.replace("model.bin}", 'model.bin\\0x"}').replace("model: {path: ", 'model: {path: "'),
                   "model.path", 2),
    "surrogate": (lambda t: t + 'prompt: "caf\\ud800"\n', "prompt", 13),
    "quality-template": (lambda t: t.replace("engine: {kind: external, path: ", "#").replace(
        "timeout_s: 60", 'timeout_s: 60\nquality: {suite: gsm8k, n: 2, template: "Q: {question}\\0"}')
        .replace("flags: {--speed: 10, --sleep-ms: 0}", "flags: {}").replace("- flag: --speed", "- flag: -t")
        .replace("values: [20]", "values: [1]"), "quality.template", 10),
}


def _bad(tmp_path: Path, case: str) -> Path:
    p = campaign(tmp_path, repeats=1)
    edit, _, _ = CASES[case]
    p.write_text(edit(p.read_text()))
    return p


@pytest.mark.parametrize("case", list(CASES))
def test_an_unpassable_string_is_one_line_from_validate_and_run(tmp_path, case):
    p = _bad(tmp_path, case)
    _, key, line = CASES[case]
    for argv in (("validate", p), ("run", p, "--out", tmp_path / "bd")):
        r = cli(*argv)
        assert r.returncode == 2, (r.stdout, r.stderr)
        err = error_line(r.stderr)
        ok = f"{p}:{line}: {key} contains" in err and ("NUL byte" in err or "U+D800" in err)
        # libyaml (PyYAML's C loader, used where it is installed) refuses a lone surrogate escape while parsing:
        # still one line naming the same file and line
        ok = ok or (case == "surrogate" and f"{p}:{line}: YAML syntax" in err and "Unicode" in err)
        assert ok, err
    assert not (tmp_path / "bd").exists()


def test_resuming_an_unfinished_folder_with_a_nul_in_its_campaign_is_one_line(tmp_path):
    """A folder started before the check (here: started clean, the runner killed mid-run, the prompt then given a
    NUL, as a folder made by an older bmoe-bench holds): the resume is refused with one line and the folder is
    left as it was."""
    p, gate = held(tmp_path, repeats=1)
    out = tmp_path / "bd"
    a = start("run", p, "--out", out)
    try:
        folder = wait_for(lambda: (folders(out) or [None])[0], timeout=120)
        wait_for(lambda: any("BMOE_PROGRESS" in x.read_text() for x in folder.glob("runs/.*.tmp/engine.log")),
                 timeout=120)
        a.kill()
        a.communicate(timeout=30)
    finally:
        gate.touch()
    before = (folder / "manifest.json").read_bytes()
    p.write_text(p.read_text() + 'prompt: "hello\\0world"\n')
    r = bench("run", p, "--out", out)
    assert r.returncode == 2 and "ValueError" not in r.stderr, r.stderr
    assert f"{p}:13: prompt contains a NUL byte" in error_line(r.stderr)
    assert (folder / "manifest.json").read_bytes() == before and json.loads(before)["status"] != "done"
    assert folders(out) == [folder]


def test_the_local_target_refuses_a_nul_argument_with_one_line(tmp_path):
    t = LocalTarget()
    try:
        with pytest.raises(UserError, match="cannot start the engine: embedded null byte"):
            t.run([os.environ.get("SHELL", "/bin/sh"), "-c", "true\0"], timeout_s=10, outputs=[],
                  out_dir=tmp_path / "o", log_path=tmp_path / "o" / "engine.log")
    finally:
        t.close()
