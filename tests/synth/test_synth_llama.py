"""Generated models through llama.cpp (llama-cpp-python): they load, generate varied greedy text, shards load by
their first file, and a wrong expert slice changes the output (so the engine's byte-identity gate can see it)."""

from __future__ import annotations

import ctypes
import dataclasses
import shutil
from pathlib import Path

import pytest

from harness.synth import ModelSpec, expert_locations, make_model, plan_model
from harness.synth.tokenizer import EOS_ID

llama_cpp = pytest.importorskip("llama_cpp")

pytestmark = pytest.mark.engine

PROMPT = b"The quick brown fox jumps over the lazy dog."


def greedy(path: Path, n: int = 16, prompt: bytes = PROMPT, n_ctx: int = 128) -> list[int]:
    llm = llama_cpp.Llama(model_path=str(path), n_ctx=n_ctx, verbose=False)
    out: list[int] = []
    for tok in llm.generate(llm.tokenize(prompt), temp=0.0, top_k=1):
        out.append(tok)
        if len(out) == n:
            break
    llm.close()
    return out


def _varied(tokens: list[int]) -> bool:
    """Not one token over and over, nor a short loop."""
    return len(set(tokens)) >= len(tokens) // 3 and max(tokens.count(t) for t in tokens) <= len(tokens) // 4


@pytest.mark.parametrize("expert_type", ["f32", "q8_0", "q4_k"])
def test_expert_types_generate_varied_text_past_32_tokens(tmp_path: Path, expert_type: str) -> None:
    (path,) = make_model(tmp_path / "m.gguf", ModelSpec(expert_type=expert_type))
    toks = greedy(path, 40)
    assert len(toks) == 40, "generation stopped early (EOS)"
    assert EOS_ID not in toks
    assert _varied(toks), toks


@pytest.mark.parametrize("arch", ["qwen2moe", "qwen3", "olmoe"])
def test_other_archs_load_and_generate(tmp_path: Path, arch: str) -> None:
    spec = ModelSpec(arch=arch, n_head_kv=4 if arch == "olmoe" else 2, dense_type="f16")
    (path,) = make_model(tmp_path / "m.gguf", spec)
    llm = llama_cpp.Llama(model_path=str(path), n_ctx=128, verbose=False)
    assert llm.metadata["general.architecture"] == arch
    llm.close()
    toks = greedy(path, 16)
    assert len(toks) == 16 and _varied(toks), toks


def test_three_shards_load_by_first_shard_and_match_one_file(tmp_path: Path) -> None:
    spec = ModelSpec(n_split=3, seed=5)
    paths = make_model(tmp_path / "s.gguf", spec)
    assert [p.name for p in paths] == ["s-00001-of-00003.gguf", "s-00002-of-00003.gguf", "s-00003-of-00003.gguf"]
    (single,) = make_model(tmp_path / "one.gguf", dataclasses.replace(spec, n_split=1))
    toks = greedy(paths[0], 16)
    assert toks == greedy(single, 16)
    paths[2].unlink()
    with pytest.raises(ValueError):
        llama_cpp.Llama(model_path=str(paths[0]), n_ctx=128, verbose=False)


def test_chat_template_applies_through_llama_cpp(tmp_path: Path) -> None:
    (path,) = make_model(tmp_path / "m.gguf", ModelSpec())
    llm = llama_cpp.Llama(model_path=str(path), n_ctx=128, verbose=False)
    tmpl = llama_cpp.llama_model_chat_template(llm.model, None)
    msgs = (llama_cpp.llama_chat_message * 1)()
    msgs[0].role, msgs[0].content = b"user", b"Hi"
    buf = ctypes.create_string_buffer(256)
    n = llama_cpp.llama_chat_apply_template(tmpl, msgs, 1, True, buf, len(buf))
    assert buf.value[:n] == b"<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    # the ChatML markers are single control tokens
    assert llm.tokenize(b"<|im_start|><|im_end|>", add_bos=False, special=True) == [3, 4]
    llm.close()


def _swap_expert(src: Path, dst: Path, spec: ModelSpec, layer: int, expert: int) -> None:
    """dst = src with `expert`'s slices in `layer` (gate, up, down) overwritten by the next expert's bytes."""
    shutil.copy(src, dst)
    other = (expert + 1) % spec.n_expert
    with open(dst, "r+b") as f:
        for loc in expert_locations(plan_model(spec)):
            if loc.layer == layer:
                f.seek(loc.offset + other * loc.nb)
                data = f.read(loc.nb)
                f.seek(loc.offset + expert * loc.nb)
                f.write(data)


@pytest.mark.parametrize("expert_type", ["f32", "q8_0", "q4_k"])
def test_one_wrong_expert_changes_greedy_output(tmp_path: Path, expert_type: str) -> None:
    spec = ModelSpec(expert_type=expert_type)
    (path,) = make_model(tmp_path / "m.gguf", spec)
    base = greedy(path, 16)
    swaps = [(layer, e) for layer in (0, spec.n_layer - 1) for e in (0, 1)]
    changed = []
    for layer, e in swaps:
        bad = tmp_path / "bad.gguf"
        _swap_expert(path, bad, spec, layer, e)
        changed.append(greedy(bad, 16) != base)
    # an expert that no token routes to cannot change anything (~10% of experts on this prompt); the rest must
    assert sum(changed) >= len(swaps) - 1, list(zip(swaps, changed, strict=True))
