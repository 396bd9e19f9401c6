"""Campaign validation: every error names the file and line, and says what to do."""


import pytest

from harness.campaigns.schema import load_campaign
from harness.campaigns.validate import plan_campaign
from harness.errors import UserError
from tests.helpers.campaign import GOOD, errors, write


def test_good_campaign_loads(tmp_path):
    c = load_campaign(write(tmp_path, GOOD))
    assert c.name == "t" and c.repeats == 2 and c.tokens == 8 and c.warmup_tokens == 2
    assert c.flags == {"-t": 2, "--moe-stream": True}
    assert c.target.mem_cap_mib == 512
    assert c.axes[0].flag == "--cache-mb" and c.axes[0].lines == (7, 7)
    assert [(v.label, v.flags) for v in c.axes[0].values] == [("--cache-mb=0", {"--cache-mb": 0}),
                                                              ("--cache-mb=64", {"--cache-mb": 64})]


def test_unknown_key_with_suggestion_and_line(tmp_path):
    p = write(tmp_path, GOOD.replace("repeats: 2", "repeat: 2"))
    assert errors(p) == [f"{p}:8: unknown key 'repeat' (did you mean 'repeats'?)"]


def test_unknown_nested_key(tmp_path):
    p = write(tmp_path, GOOD.replace("mem_cap_mib: 512", "mem_cap: 512"))
    (line,) = errors(p)
    assert line.startswith(f"{p}:3: unknown key 'mem_cap' in target (did you mean 'mem_cap_mib'?)")


def test_wrong_type_names_the_key_and_value(tmp_path):
    p = write(tmp_path, GOOD.replace("tokens: 8", "tokens: lots"))
    assert errors(p) == [f"{p}:9: tokens must be an integer, got a string 'lots'"]


def test_all_problems_are_listed_in_line_order(tmp_path):
    p = write(tmp_path, GOOD.replace("repeats: 2", "repeats: 0").replace("kind: local", "kind: phone"))
    lines = errors(p)
    assert [ln.split(":")[1] for ln in lines] == ["3", "8"]
    assert "target.kind must be one of local, adb, ssh, termux, got 'phone'" in lines[0]
    assert "repeats must be >= 1" in lines[1]


def test_yaml_syntax_error_has_a_line(tmp_path):
    p = write(tmp_path, GOOD + "axes: [\n")
    (line,) = errors(p)
    assert line.startswith(f"{p}:") and "YAML syntax" in line


def test_missing_name_and_model(tmp_path):
    p = write(tmp_path, "repeats: 2\n")
    lines = errors(p)
    assert any("missing key 'name'" in x for x in lines)
    assert any("missing key 'model'" in x for x in lines)


def test_warmup_must_leave_tokens(tmp_path):
    p = write(tmp_path, GOOD.replace("warmup_tokens: 2", "warmup_tokens: 8"))
    assert "warmup_tokens (8) must be less than tokens (8)" in errors(p)[0]


def test_explicit_cell_differing_in_two_flags_needs_cross(tmp_path):
    text = GOOD + "cells:\n  - {--cache-mb: 64, --io-threads: 2}\n"
    p = write(tmp_path, text)
    (line,) = errors(p)
    assert line.startswith(f"{p}:12: cell --cache-mb=64 --io-threads=2 differs from the base in 2 flags")
    assert "set cross: true" in line
    ok = write(tmp_path, text + "cross: true\n", "ok.yaml")
    assert len(plan_campaign(ok).cells) >= 3


def test_flag_combination_the_engine_refuses(tmp_path):
    # --cache-mb only applies with --moe-stream: the engine's own parser says so, at the axis line
    p = write(tmp_path, GOOD.replace("flags: {-t: 2, --moe-stream: true}", "flags: {-t: 2}"))
    lines = errors(p)
    assert lines[0].startswith(f"{p}:7: cell --cache-mb=0: the engine would refuse it:")
    assert "--cache-mb only applies with --moe-stream" in lines[0]


def test_engine_refusal_of_a_bad_value(tmp_path):
    p = write(tmp_path, GOOD.replace("values: [0, 64]", "values: [0, lots]"))
    (line,) = errors(p)
    assert line.startswith(f"{p}:7: cell --cache-mb=lots: the engine would refuse it")


def test_harness_owned_flags_are_refused(tmp_path):
    p = write(tmp_path, GOOD.replace("{-t: 2,", "{-n: 4, -t: 2,"))
    assert "flags: -n is set by the harness from 'tokens'" in errors(p)[0]


def test_bad_recipe_is_reported_at_the_recipe(tmp_path):
    p = write(tmp_path, GOOD.replace("{n_layer: 2}", "{n_layer: 2, n_wings: 3}"))
    (line,) = errors(p)
    assert line.startswith(f"{p}:2: unknown key 'n_wings' in model.recipe")
    p = write(tmp_path, GOOD.replace("{n_layer: 2}", "{n_layer: 0}"))
    (line,) = errors(p)
    assert line.startswith(f"{p}:2: model.recipe: --layers must be at least 1")
    p = write(tmp_path, GOOD.replace("{n_layer: 2}", "{shape: huge}"))
    (line,) = errors(p)
    assert line.startswith(f"{p}:2: model.recipe: --shape 'huge' is not one of tiny")


def test_adb_target_needs_an_external_engine(tmp_path):
    p = write(tmp_path, GOOD.replace("model: {recipe: {n_layer: 2}}", "model: {path: /data/local/tmp/m.gguf}")
              .replace("target: {kind: local, mem_cap_mib: 512}", "target: {kind: adb}"))
    assert any("engine bmoe runs where Python runs" in x for x in errors(p))


def test_missing_local_model_file(tmp_path):
    p = write(tmp_path, GOOD.replace("model: {recipe: {n_layer: 2}}", "model: {path: nowhere.gguf}"))
    (line,) = errors(p)
    assert line.startswith(f"{p}:2: model.path nowhere.gguf does not exist")


def test_campaign_error_is_one_line_user_error(tmp_path):
    p = write(tmp_path, GOOD.replace("repeats: 2", "repeat: 2").replace("tokens: 8", "tokens: x"))
    with pytest.raises(UserError) as ei:
        plan_campaign(p)
    assert "\n" not in str(ei.value) and "and 1 more" in str(ei.value)


def test_missing_file(tmp_path):
    with pytest.raises(UserError, match="no such campaign file"):
        plan_campaign(tmp_path / "nope.yaml")


def test_axis_needs_flag_or_name(tmp_path):
    p = write(tmp_path, GOOD.replace("  - flag: --cache-mb\n", "  - flag: --cache-mb\n    name: x\n"))
    assert "exactly one of flag" in errors(p)[0]


def test_bundle_axis_labels_must_be_words(tmp_path):
    p = write(tmp_path, GOOD.replace("  - flag: --cache-mb\n    values: [0, 64]",
                                     "  - name: mode\n    values: {'a b': {--moe-stream: true}}"))
    assert "label 'a b' must be a word" in errors(p)[0]


@pytest.mark.parametrize("line,msg", [
    ("order: zigzag", "order must be one of interleaved, alternating, random, got 'zigzag'"),
    ("seed: -1", "seed must be >= 0, got -1"),
    ("cross: maybe", "cross must be a boolean, got a string 'maybe'"),
    ("timeout_s: 0", "timeout_s must be >= 1, got 0"),  # the value as written
    ("description: [a]", "description must be a string, got a list"),
    ("cooldown: {max_wait_s: soon}", "cooldown.max_wait_s must be a number, got a string 'soon'"),
    ("engine: {kind: external}", "engine kind external needs exactly one of path"),
])
def test_every_top_level_key_is_checked(tmp_path, line, msg):
    p = write(tmp_path, GOOD + line + "\n")
    (err,) = errors(p)
    assert err.startswith(f"{p}:11: {msg}"), err


def test_misspelt_axis_key_gets_a_hint(tmp_path):
    p = write(tmp_path, GOOD.replace("  - flag: --cache-mb", "  - flg: --cache-mb"))
    assert f"{p}:6: unknown key 'flg' in axes[0] (did you mean 'flag'?)" in errors(p)


def test_rules_between_fields_are_all_listed(tmp_path):
    p = write(tmp_path, GOOD.replace("target: {kind: local, mem_cap_mib: 512}",
                                     "target: {kind: adb, mem_cap_mib: 512}"))
    lines = errors(p)
    assert [ln.split(":")[1] for ln in lines] == ["2", "3", "3"]
    assert "a model recipe generates a local file" in lines[0]
    assert any("mem_cap_mib and drop_caches apply to target local only" in x for x in lines)
    assert any("engine bmoe runs where Python runs" in x for x in lines)


def test_the_parts_are_the_stored_formats_models(tmp_path):
    from harness.formats.campaign import Cooldown, EngineSpec, ModelSource, TargetSpec

    c = load_campaign(write(tmp_path, GOOD))
    assert isinstance(c.model, ModelSource) and c.model.recipe == {"n_layer": 2}
    assert isinstance(c.target, TargetSpec) and isinstance(c.engine, EngineSpec)
    assert isinstance(c.cooldown, Cooldown) and c.cooldown.max_wait_s == 300.0
    assert c.engine.args == {"model": "-m", "prompt": "-p", "tokens": "-n", "csv": "--csv", "progress": "--progress"}
