"""`--set KEY=VALUE`: a campaign field overridden from the command line, checked like the file, part of
the plan (hash, manifest, reproduce command)."""

from __future__ import annotations

import shlex
import subprocess
import textwrap
from io import StringIO

import pytest
from rich.console import Console

from harness.campaigns.overrides import parse_value
from harness.campaigns.runner import plan_record, run_campaign
from harness.campaigns.validate import plan_campaign
from harness.campaigns.yamlsrc import CampaignError
from harness.formats.manifest import load_manifest, plan_hash, save_manifest
from tests.helpers.campaign import GOOD
from tests.helpers.runner import BENCH, campaign, quiet


@pytest.fixture
def good(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text(textwrap.dedent(GOOD))
    return p


def errors(path, *sets):
    with pytest.raises(CampaignError) as ei:
        plan_campaign(path, overrides=sets)
    return ei.value.lines


@pytest.mark.parametrize(("text", "value"), [
    ("8", 8), ("true", True), ("null", None), ("", None), ("1.5", 1.5), ("auto", "auto"),
    ("Hello: a prompt, with # and : in it", "Hello: a prompt, with # and : in it"), ("'8'", "8"),
    ("[0, 512]", [0, 512]), ("{shape: tiny}", {"shape": "tiny"}),
])
def test_values_are_yaml_scalars_as_the_file_would_read_them(text, value):
    got = parse_value(text)
    assert got == value and type(got) is type(value)


def test_overrides_change_the_plan_and_its_hash(good):
    plain = plan_campaign(good)
    sets = ("tokens=12", "target.mem_cap_mib=1024", "flags.--cache-mb=32", "flags.-t=4", "seed=7")
    plan = plan_campaign(good, overrides=sets)
    c = plan.campaign
    assert (c.tokens, c.target.mem_cap_mib, c.seed) == (12, 1024, 7)
    assert c.flags == {"-t": 4, "--moe-stream": True, "--cache-mb": 32}
    assert [x.label for x in plan.cells] == ["base", "--cache-mb=0", "--cache-mb=64"]
    rec = plan_record(plan)
    assert rec.overrides == list(sets) and rec.base_flags["--cache-mb"] == 32
    assert plan_hash(rec) != plan_hash(plan_record(plain))
    assert "overrides" not in plan_record(plain).dump()  # without --set the record (and hash) is as before


def test_an_override_equal_to_the_file_is_still_another_plan(good):
    """The record lists the arguments, so a different --set is a different plan even when it changes nothing."""
    assert plan_hash(plan_record(plan_campaign(good, overrides=["tokens=8"]))) != \
        plan_hash(plan_record(plan_campaign(good)))


def test_nested_keys_are_created_and_shorthands_opened(good):
    c = plan_campaign(good, overrides=["cooldown.max_wait_s=5", "cooldown.poll_s=0.5",
                                       "model.recipe.n_layer=3"]).campaign
    assert (c.cooldown.max_wait_s, c.cooldown.poll_s) == (5, 0.5)
    assert dict(c.model.recipe) == {"n_layer": 3}
    text = good.read_text().replace("target: {kind: local, mem_cap_mib: 512}", "target: local")
    good.write_text(text)
    assert plan_campaign(good, overrides=["target.mem_cap_mib=256"]).campaign.target.mem_cap_mib == 256


def test_a_model_source_replaces_the_files_one(good, tmp_path):
    m = tmp_path / "m.gguf"
    m.write_bytes(b"\0")
    c = plan_campaign(good, overrides=[f"model.path={m}"]).campaign
    assert c.model.path == str(m) and c.model.recipe is None


def test_list_entries_and_flag_removal(good):
    plan = plan_campaign(good, overrides=["axes.0.values=[0, 128]"])
    assert [x.label for x in plan.cells] == ["base", "--cache-mb=0", "--cache-mb=128"]
    lines = errors(good, "flags.--moe-stream=null")  # null = absent: the cache axis needs streaming
    assert [x.split(": the engine")[0] for x in lines] == [f"{good}:7: cell --cache-mb={v}" for v in (0, 64)]
    assert all(x.endswith("--cache-mb only applies with --moe-stream (add it, or drop --cache-mb)") for x in lines)


def test_later_arguments_win(good):
    assert plan_campaign(good, overrides=["tokens=12", "tokens=16"]).campaign.tokens == 16


@pytest.mark.parametrize(("arg", "message"), [
    ("tokenz=8", "--set tokenz=8: unknown key 'tokenz' (did you mean 'tokens'?)"),
    ("target.mem_cap=4", "--set target.mem_cap=4: unknown key 'mem_cap' in target (did you mean 'mem_cap_mib'?)"),
    ("tokens=lots", "--set tokens=lots: tokens must be an integer, got a string 'lots'"),
    ("repeats=0", "--set repeats=0: repeats must be >= 1, got 0"),
    ("target.kind=phone", "--set target.kind=phone: target.kind must be one of local, adb, ssh, termux, got 'phone'"),
    ("flags.cache-mb=0", "--set flags.cache-mb=0: flags: 'cache-mb' is not an engine flag; write it as the "
                         "engine does, e.g. -t or --cache-mb"),
    ("flags.--io-threads=0", "--set flags.--io-threads=0: cell base: the engine would refuse it: bmoe: "
                             "--io-threads must be 1..8, got 0"),
    ("tokens", "--set tokens: needs KEY=VALUE (e.g. --set target.serial=R5CT1234 or --set 'flags.--cache-mb=0')"),
    ("=8", "--set =8: needs KEY=VALUE"),
    ("model..path=x", "--set model..path=x: 'model..path' has an empty part"),
    ("tokens.x=1", "--set tokens.x=1: tokens is an integer in the file, not a mapping"),
    ("axes.3.values=[1]", "--set axes.3.values=[1]: axes has 1 entry: index it with 0..0"),
    ("axes.0.values=[1,", "--set axes.0.values=[1,: the value is not YAML"),
])
def test_a_bad_override_is_one_line_naming_the_argument(good, arg, message):
    (line,) = errors(good, arg)
    assert line.startswith(message), line


@pytest.mark.parametrize("arg", ["tokenz=8", "tokens=lots", "tokens"], ids=["bad-key", "bad-value", "no-equals"])
@pytest.mark.parametrize("command", ["validate", "run"])
def test_the_cli_exits_2_with_one_line(good, tmp_path, arg, command):
    extra = ["--out", str(tmp_path / "bd")] if command == "run" else []
    p = subprocess.run([*BENCH, command, str(good), *extra, "--set", arg], capture_output=True, text=True,
                       timeout=120)
    lines = [x for x in p.stderr.splitlines() if x.strip()]
    assert p.returncode == 2 and len(lines) == 1 and f"--set {arg}" in lines[0], p.stderr
    assert not (tmp_path / "bd").exists()


def test_validate_shows_the_overrides_and_the_plan(good):
    p = subprocess.run([*BENCH, "validate", str(good), "--set", "tokens=12", "--set", "flags.--cache-mb=32"],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert f"{good}: with --set tokens=12, --set flags.--cache-mb=32" in p.stdout
    assert "3 cells x 2 repeats = 6 runs of 12 tokens" in p.stdout


def test_a_run_records_its_overrides_and_resumes_only_with_the_same_ones(tmp_path):
    p = campaign(tmp_path, repeats=1, tokens=4)
    root = tmp_path / "bd"
    sets = ["tokens=5", "flags.--speed=12", "description=a prompt: with spaces"]
    res = run_campaign(p, root=root, console=quiet(), overrides=sets)
    m = load_manifest(res.folder)
    assert m.status == "complete" and m.campaign.overrides == sets and m.campaign.tokens == 5
    assert m.campaign.base_flags["--speed"] == 12
    assert all(r.tokens == 5 for r in m.runs)
    # the reproduce command names the same file and --set arguments, so it plans the same folder
    argv = shlex.split(m.reproduce)
    assert argv[:3] == ["bmoe-bench", "run", str(p)]
    again = [argv[i + 1] for i, a in enumerate(argv) if a == "--set"]
    assert again == sets
    assert plan_hash(plan_record(plan_campaign(p, overrides=again))) == m.plan_hash

    m.status = "interrupted"  # as if stopped: the same --set resumes it, other ones start a new folder
    save_manifest(res.folder, m)
    console = Console(file=StringIO(), width=1000)
    other = run_campaign(p, root=root, console=console, overrides=["tokens=6"])
    assert other.folder != res.folder and other.n_skipped == 0
    assert load_manifest(other.folder).campaign.overrides == ["tokens=6"]
    same = run_campaign(p, root=root, console=quiet(), overrides=sets)
    assert same.folder == res.folder and same.n_skipped == len(m.runs)
    note = console.file.getvalue()
    assert f"note: {res.folder} is unfinished with a different plan" in note
    assert "--set tokens=5 --set flags.--speed=12 --set 'description=a prompt: with spaces'" in note
