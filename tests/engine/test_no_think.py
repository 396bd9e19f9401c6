"""`--no-think`: reasoning suppressed by the model's own chat template. The renderer's exact prompts per family
(harmony, Qwen3's enable_thinking) and its refusals need no model; `--chatml` alone keeps llama.cpp's
built-in rendering byte for byte; the synthetic models carry each template with the tokens it uses; then the
engine gates: streamed == resident with `--no-think --chatml` on a qwen3moe and a gpt-oss model, and a model
whose template has no switch is refused in one line, exit 2."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from harness.engine.config import parse_cli
from harness.engine.model.gguf_layout import load_layout
from harness.engine.model.prompt import NO_THINK_HARMONY, NO_THINK_SWITCH, build_prompt
from harness.errors import UserError
from harness.synth import ModelSpec, make_model, plan_model
from harness.synth.shapes import shape_spec
from harness.synth.tokenizer import (
    CHATML_TEMPLATE,
    HARMONY_TEMPLATE,
    QWEN3,
    QWEN3_TEMPLATE,
    TYPE_USER_DEFINED,
    build_vocab,
)
from tests.helpers.engine import bmoe

HARMONY_SYSTEM_LOW = ("<|start|>system<|message|>Knowledge cutoff: 2024-06\n\nReasoning: low\n\n# Valid channels: "
                      "analysis, commentary, final. Channel must be included for every message.<|end|>")


def _build(template: str, *, no_think: bool, prompt: str = "Hi") -> tuple[str, str]:
    p = build_prompt("m.gguf", template, prompt, chatml=True, no_think=no_think)
    return p.text, p.no_think


# -- the renderer (no model) -------------------------------------------------------------------------------------

def test_qwen3_no_think_renders_the_empty_think_block():
    assert _build(QWEN3_TEMPLATE, no_think=True) == (
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n", NO_THINK_SWITCH)


def test_harmony_no_think_is_low_effort_and_prefilled_in_the_final_channel():
    assert _build(HARMONY_TEMPLATE, no_think=True) == (
        HARMONY_SYSTEM_LOW + "<|start|>user<|message|>Hi<|end|><|start|>assistant<|channel|>final<|message|>",
        NO_THINK_HARMONY)


def test_chatml_alone_is_llama_cpps_builtin_form_as_before():
    """--chatml without --no-think still goes through llama_chat_apply_template: these are its outputs."""
    chatml = "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    assert _build(CHATML_TEMPLATE, no_think=False) == (chatml, "")
    assert _build(QWEN3_TEMPLATE, no_think=False) == (chatml, "")  # known by <|im_start|>: no think handling
    assert _build(HARMONY_TEMPLATE, no_think=False) == ("<|start|>user<|message|>Hi<|end|><|start|>assistant", "")
    assert build_prompt("m.gguf", "", "Hi", chatml=False, no_think=False).text == "Hi"


@pytest.mark.parametrize("template, said", [
    (CHATML_TEMPLATE, "m.gguf: its chat template has no way to switch reasoning off"),
    ("", "m.gguf has no chat template (tokenizer.chat_template); drop --chatml and --no-think"),
    ("{{ raise_exception('no') }}", "m.gguf: its chat template failed to render (ValueError: no)"),
    (HARMONY_TEMPLATE.replace("'<|start|>assistant'", "'<|start|>assistant\\n'"),
     "m.gguf: its harmony chat template does not end the prompt with <|start|>assistant"),
])
def test_a_template_without_a_switch_is_refused_in_one_line(template, said):
    with pytest.raises(UserError) as e:
        _build(template, no_think=True)
    assert str(e.value).startswith(said) and "\n" not in str(e.value)


def test_no_think_needs_chatml_and_is_in_the_resolved_config():
    with pytest.raises(UserError, match="--no-think .* add --chatml"):
        parse_cli(["-m", "x.gguf", "--no-think"])
    assert parse_cli(["-m", "x.gguf", "--no-think", "--chatml"]).resolved()["no_think"] is True


# -- the synthetic models carry each template ----------------------------------------------------------------

def test_default_templates_are_unchanged_and_named_ones_carry_their_tokens(tmp_path: Path):
    for arch, name in (("qwen3moe", "chatml"), ("gpt-oss", "harmony")):
        base = shape_spec("tiny", arch=arch)
        assert plan_model(base).kvs == plan_model(dataclasses.replace(base, chat_template=name)).kvs
    v = build_vocab(320, QWEN3)
    assert [(t, ty) for t, ty in zip(v.tokens, v.types, strict=False) if ty == TYPE_USER_DEFINED] == [
        ("<think>", TYPE_USER_DEFINED), ("</think>", TYPE_USER_DEFINED)]
    (q,) = make_model(tmp_path / "q.gguf", ModelSpec(chat_template="qwen3"))
    (n,) = make_model(tmp_path / "n.gguf", ModelSpec(chat_template="none"))
    assert load_layout(q).chat_template == QWEN3_TEMPLATE  # what the engine reads, before loading
    assert load_layout(n).chat_template == ""
    with pytest.raises(UserError, match="--chat-template 'qwen4' is not one of chatml, harmony, qwen3, none"):
        plan_model(ModelSpec(chat_template="qwen4"))


# -- the engine gates -------------------------------------------------------------------------------------------

N = 24


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("nothink")
    specs = {
        "qwen3": ModelSpec(chat_template="qwen3", seed=31),
        "gpt-oss": dataclasses.replace(shape_spec("tiny", arch="gpt-oss"), n_swa=16, seed=32),
        "chatml": ModelSpec(seed=33),
        "none": ModelSpec(chat_template="none", seed=34),
    }
    return {k: make_model(d / f"{k}.gguf", s)[0] for k, s in specs.items()}


@pytest.mark.engine
@pytest.mark.parametrize("name, how", [("qwen3", NO_THINK_SWITCH), ("gpt-oss", NO_THINK_HARMONY)])
def test_no_think_streamed_matches_resident(models, tmp_path, name, how):
    res = bmoe(models[name], "--chatml", "--no-think", n=N, tmp=tmp_path)
    assert res.rc == 0, res.stderr
    assert len(res.tokens) == N and len(set(res.tokens)) > N // 3, res.tokens
    assert res.preamble["no_think"] == how and res.preamble["cfg.no_think"] == "True"
    for flags in (("--cache-mb", "0"), ("--cache-mb", "1")):
        r = bmoe(models[name], "--moe-stream", *flags, "--chatml", "--no-think", n=N, tmp=tmp_path)
        assert r.rc == 0, r.stderr
        assert r.tokens == res.tokens, flags
    think = bmoe(models[name], "--chatml", n=N, tmp=tmp_path)
    assert "no_think" not in think.preamble
    assert res.summary["n_prompt"] > think.summary["n_prompt"], "the no-think prompt is the longer one"


@pytest.mark.engine
@pytest.mark.parametrize("name, said", [("chatml", "its chat template has no way to switch reasoning off"),
                                        ("none", "has no chat template")])
def test_a_model_without_a_switch_exits_2_with_one_line(models, tmp_path, name, said):
    r = bmoe(models[name], "--chatml", "--no-think", n=4, tmp=tmp_path)
    assert r.rc == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and str(models[name]) in lines[0] and said in lines[0], r.stderr
    assert "Traceback" not in r.stderr
