"""A synthetic model's fields are declared once (harness.formats.model_fields): ModelSpec is that declaration,
make-model has one option per field with a flag and sets that field, and a campaign recipe takes the fields
marked for it."""

from __future__ import annotations

import dataclasses
from typing import get_type_hints

import pytest
import typer

from harness.bench_cli import app
from harness.formats.campaign import Recipe
from harness.formats.model_fields import ModelFields, flag_fields, meta, recipe_fields
from harness.synth import ModelSpec


def test_model_spec_is_the_declaration():
    assert [f.name for f in dataclasses.fields(ModelSpec)] == [f.name for f in dataclasses.fields(ModelFields)]
    assert ModelSpec() == dataclasses.replace(ModelSpec())


class _Stop(Exception):
    pass


def test_make_model_has_one_option_per_flagged_field_setting_it(monkeypatch):
    cmd = typer.main.get_command(app).commands["make-model"]
    opts = [p.opts[0] for p in cmd.params if p.param_type_name == "option"]
    assert opts == ["--shape", *[meta(f).flag for f in flag_fields()], "--progress", "--force", "--dry-run"]
    import harness.commands.make_model as mm

    seen: list[ModelSpec] = []

    def plan(spec: ModelSpec):  # the spec make-model built, and stop there
        seen.append(spec)
        raise _Stop

    monkeypatch.setattr(mm, "plan_model", plan)
    argv, want = ["make-model", "x.gguf", "--dry-run"], {}
    for i, f in enumerate(flag_fields()):
        if get_type_hints(ModelFields)[f.name] is int:  # the others have choices: their defaults stand
            want[f.name] = 1000 + i
            argv += [meta(f).flag, str(1000 + i)]
    with pytest.raises(_Stop):
        app(args=argv, standalone_mode=False)
    assert len(want) >= 10 and {k: getattr(seen[0], k) for k in want} == want


def test_a_recipe_takes_the_fields_marked_for_it():
    keys = get_type_hints(Recipe)
    assert list(keys) == ["shape", *[f.name for f in recipe_fields()]]
    assert keys["arch_params"] == dict[str, int]  # a mapping in YAML, name/value pairs in the spec
    assert {"n_layer", "seed", "chat_template"} <= set(keys) and not {"rms_eps", "n_swa", "vocab_type"} & set(keys)


def test_the_synth_messages_name_declared_flags():
    """The refusals of harness/synth name the make-model flag to change: each one they spell is a declared one."""
    import ast
    import re
    from pathlib import Path

    cmd = typer.main.get_command(app).commands["make-model"]
    known = {o for p in cmd.params for o in p.opts if o.startswith("--")}
    root = Path(__file__).resolve().parents[2] / "harness" / "synth"
    spelt = {}
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                for flag in re.findall(r"(?<![\w-])--[a-z][a-z-]*", node.value):
                    spelt.setdefault(flag, path.name)
    assert {"--layers", "--heads-kv", "--expert-type"} <= set(spelt)
    assert not {f: p for f, p in spelt.items() if f not in known}, "not a make-model flag"
