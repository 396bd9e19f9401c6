"""The committed trained model (harness/data/models/tiny: transformers' Qwen3-MoE trained by scripts/train-model.sh,
converted by the pinned llama.cpp converter, quantized by its llama-quantize to Q4_K_M): the byte-identity gates on
a file made by the field's own tools, llama.cpp's tokens against the tokenizer it was trained with, and the card's
hashes against the file."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from gguf import GGUFReader

from harness.engine.model import default_model
from harness.formats.route_trace import DECODE, read_route_trace
from tests.helpers.engine import bmoe
from tests.helpers.gates import N
from tests.helpers.gates import stream as _stream

pytestmark = pytest.mark.engine

FOLDER = default_model.folder()
PROMPT = "The os.path module"


@pytest.fixture(scope="module")
def models() -> dict[str, Path]:
    return {"tiny": default_model.path()}


def test_card_hash_is_the_files():
    recipe = json.loads((FOLDER / "recipe.json").read_text())
    p = default_model.path()
    assert hashlib.sha256(p.read_bytes()).hexdigest() == recipe["files"][p.name]


def test_made_by_the_real_toolchain():
    """What only the converter and llama-quantize produce: a Q4_K_M mix (Q4_K beside a fallback for the 128-wide
    down projection rows, Q6_K where the mix asks), the BPE vocabulary with its qwen2 pre-tokenizer, the template."""
    r = GGUFReader(default_model.path())
    kv = {f.name: f for f in r.fields.values()}
    arch = bytes(kv["general.architecture"].parts[-1]).decode()
    assert arch == "qwen3moe"
    assert bytes(kv["tokenizer.ggml.pre"].parts[-1]).decode() == "qwen2"
    assert bytes(kv["tokenizer.ggml.model"].parts[-1]).decode() == "gpt2"
    assert "<|im_start|>" in bytes(kv["tokenizer.chat_template"].parts[-1]).decode()
    types = {t.name: t.tensor_type.name for t in r.tensors}
    assert types["blk.0.ffn_gate_exps.weight"] == "Q4_K"
    assert len(set(types.values())) >= 3, types  # a mix, not one type


def test_llama_cpp_tokenizes_as_the_trained_tokenizer():
    llama_cpp = pytest.importorskip("llama_cpp")
    check = json.loads((FOLDER / "tokcheck.json").read_text())
    llm = llama_cpp.Llama(model_path=str(default_model.path()), vocab_only=True, verbose=False)
    try:
        assert llm.tokenize(check["text"].encode(), add_bos=False, special=False) == check["ids"]
    finally:
        llm.close()


@pytest.fixture(scope="module")
def resident_tiny(tmp_path_factory) -> list[int]:
    d = tmp_path_factory.mktemp("resident")
    r = bmoe(default_model.path(), n=N, tmp=d, prompt=PROMPT)
    assert r.rc == 0, r.stderr
    assert len(r.tokens) == N
    return r.tokens


@pytest.mark.parametrize("flags", [("--cache-mb", "0"), ("--cache-mb", "4"), ("--cache-mb", "4", "--no-odirect"),
                                   ("--cache-mb", "4", "--prefetch", "1", "--predict-prefetch"),
                                   ("--cache-mb", "4", "--predict-prefetch", "--predict-min-recall", "0.5")])
def test_streamed_equals_resident(models, resident_tiny, tmp_path, flags):
    r = bmoe(models["tiny"], "--moe-stream", *flags, n=N, tmp=tmp_path, prompt=PROMPT)
    assert r.rc == 0, r.stderr
    assert r.tokens == resident_tiny
    assert r.summary["mib_read_per_token"] > 0


def test_one_wrong_expert_diverges(models, resident_tiny, tmp_path):
    """The negative control: an expert the run routes to in decode is loaded with its neighbour's bytes."""
    trace = tmp_path / "t.route.csv"
    ok = bmoe(models["tiny"], "--moe-stream", "--cache-mb", "0", "--route-trace", str(trace), n=N, tmp=tmp_path,
              prompt=PROMPT)
    assert ok.rc == 0 and ok.tokens == resident_tiny, ok.stderr
    first = next(r for r in read_route_trace(trace).rows if r.phase == DECODE)
    wrong = f"{first.layer},{first.expert},{(first.expert + 1) % 32}"
    bad = bmoe(models["tiny"], "--moe-stream", "--cache-mb", "0", n=N, tmp=tmp_path, prompt=PROMPT,
               env={"BMOE_TEST_WRONG_EXPERT": wrong})
    assert bad.rc == 0, bad.stderr
    assert bad.tokens != resident_tiny


def test_gates_helper_agrees(models, resident_tiny, tmp_path):
    """The shared gate helper (the default prompt) also runs this file streamed."""
    assert len(_stream(models, tmp_path, "tiny", "--cache-mb", "2").tokens) == N
