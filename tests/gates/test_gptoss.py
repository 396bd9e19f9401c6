"""gpt-oss: the synthetic file (exactly the loader's tensors, MXFP4 experts with sane exponents, harmony template,
sizes of the published GGUFs) without llama.cpp; then through llama.cpp and the engine: it loads and generates,
its sliding window matters, the template applies, and streamed output equals resident output (the gates)."""

from __future__ import annotations

import ctypes
import dataclasses
from pathlib import Path

import numpy as np
import pytest
from gguf import GGUFReader
from gguf.constants import GGMLQuantizationType as QT
from gguf.quants import dequantize

from harness.bench_cli import main as bench_main
from harness.engine.model.gguf_layout import load_layout
from harness.synth import ModelSpec, expert_locations, make_model, plan_model
from harness.synth.fill import tensor_chunks
from harness.synth.shapes import shape_spec
from harness.synth.tokenizer import HARMONY, HARMONY_TEMPLATE
from tests.gates.test_engine_gates import _stream, resident  # noqa: F401  (resident: its fixture, over this module's `models`)
from tests.synth.test_synth_llama import greedy

TINY = shape_spec("tiny", arch="gpt-oss")
E, FF, D = TINY.n_expert, TINY.n_ff_exp, TINY.n_embd


def _field(r: GGUFReader, key: str):
    return r.fields[key].contents()


def _loader_tensors(spec: ModelSpec) -> dict[str, tuple[int, ...]]:
    """What the pinned llama.cpp's gpt-oss loader (its openai-moe load_arch_tensors) creates, shapes in ggml
    order, plus the optional q/k/v biases of create_tensor_qkv that the published files carry."""
    d, e, ff, hd = spec.n_embd, spec.n_expert, spec.n_ff_exp, spec.head_dim
    n_q, n_kv = spec.n_head * hd, spec.n_head_kv * hd
    out = {"token_embd.weight": (d, spec.n_vocab), "output_norm.weight": (d,), "output.weight": (d, spec.n_vocab)}
    for il in range(spec.n_layer):
        p = f"blk.{il}."
        out |= {
            p + "attn_norm.weight": (d,), p + "post_attention_norm.weight": (d,),
            p + "attn_q.weight": (d, n_q), p + "attn_k.weight": (d, n_kv), p + "attn_v.weight": (d, n_kv),
            p + "attn_q.bias": (n_q,), p + "attn_k.bias": (n_kv,), p + "attn_v.bias": (n_kv,),
            p + "attn_output.weight": (n_q, d), p + "attn_output.bias": (d,), p + "attn_sinks.weight": (spec.n_head,),
            p + "ffn_gate_inp.weight": (d, e), p + "ffn_gate_inp.bias": (e,),
            p + "ffn_gate_exps.weight": (d, ff, e), p + "ffn_up_exps.weight": (d, ff, e),
            p + "ffn_down_exps.weight": (ff, d, e),
            p + "ffn_gate_exps.bias": (ff, e), p + "ffn_up_exps.bias": (ff, e), p + "ffn_down_exps.bias": (d, e),
        }
    return out


def test_tiny_file_holds_exactly_the_loaders_tensors_and_keys(tmp_path: Path) -> None:
    assert (TINY.expert_type, TINY.n_swa, TINY.rope_freq_base) == ("mxfp4", 128, 150000.0)
    (path,) = make_model(tmp_path / "g.gguf", TINY)
    r = GGUFReader(path)
    got = {t.name: tuple(int(x) for x in t.shape) for t in r.tensors}
    assert got == _loader_tensors(TINY)
    types = {t.name: t.tensor_type for t in r.tensors}
    assert {types[n] for n in got if n.endswith("_exps.weight")} == {QT.MXFP4}
    assert {types[n] for n in got if n.endswith(".bias") or "sinks" in n or "norm" in n} == {QT.F32}
    assert _field(r, "general.architecture") == "gpt-oss"
    assert _field(r, "general.file_type") == 38  # LLAMA_FTYPE_MOSTLY_MXFP4_MOE
    for key, want in (("expert_count", E), ("expert_used_count", 2), ("expert_feed_forward_length", FF),
                      ("attention.sliding_window", 128), ("attention.head_count", 4), ("rope.scaling.type", "yarn"),
                      ("rope.scaling.factor", 32.0), ("rope.scaling.original_context_length", 4096)):
        assert _field(r, f"gpt-oss.{key}") == want, key
    assert "gpt-oss.attention.sliding_window_pattern" not in r.fields  # llama.cpp's default: every other layer
    toks = _field(r, "tokenizer.ggml.tokens")
    assert toks[: len(HARMONY.tokens)] == [t for t, _ in HARMONY.tokens]
    assert toks[_field(r, "tokenizer.ggml.eos_token_id")] == "<|return|>"
    assert _field(r, "tokenizer.chat_template") == HARMONY_TEMPLATE


def test_mxfp4_blocks_have_sane_exponents_and_the_planned_spread() -> None:
    for spec in (TINY, shape_spec("gpt-oss-120b")):
        for t in plan_model(spec).tensors[:40]:
            if t.dtype != "mxfp4":
                continue
            raw = np.frombuffer(next(tensor_chunks(t, 0)), dtype=np.uint8)
            exps = raw.reshape(-1, 17)[:, 0]
            assert 118 <= int(exps.min()) and int(exps.max()) <= 127, (t.name, exps.min(), exps.max())
            assert len(set(exps.tolist())) == 2  # stochastic rounding between two neighbouring exponents
            x = dequantize(raw.reshape(-1, t.row_bytes), QT.MXFP4)
            assert np.all(np.isfinite(x))
            assert abs(float(x.mean())) < 0.05 * t.std
            assert 0.85 * t.std < float(x.std()) < 1.2 * t.std, t.name


# Published: ggml-org's gpt-oss-20b-mxfp4.gguf and gpt-oss-120b-mxfp4 (3 shards), whose tensor data llama.cpp
# reports as 11.27 GiB and 59.02 GiB (12.10 GB and 63.37 GB).
PUBLISHED_GIB = {"gpt-oss-20b": 11.27, "gpt-oss-120b": 59.02}


@pytest.mark.parametrize(("name", "n_layer", "n_expert"), [("gpt-oss-20b", 24, 32), ("gpt-oss-120b", 36, 128)])
def test_real_shapes_and_sizes_within_5pct_of_the_published(name: str, n_layer: int, n_expert: int) -> None:
    spec = shape_spec(name)
    assert (spec.n_layer, spec.n_expert, spec.n_expert_used, spec.n_embd, spec.n_ff_exp) == (
        n_layer, n_expert, 4, 2880, 2880)
    assert (spec.n_head, spec.n_head_kv, spec.head_dim, spec.n_swa, spec.n_vocab) == (64, 8, 64, 128, 201088)
    assert (spec.expert_type, spec.dense_type) == ("mxfp4", "q8_0")
    plan = plan_model(spec)
    # MXFP4: 17 bytes per 32 weights; one expert = gate + up (2880 x 2880 each) + down (2880 x 2880)
    per_expert = 3 * 2880 * 2880 // 32 * 17
    assert {loc.nb for loc in expert_locations(plan)} == {2880 * 2880 // 32 * 17}
    assert sum(t.nbytes for t in plan.tensors if t.expert_role) == n_layer * n_expert * per_expert
    # Q8_0 (34 bytes per 32): embeddings and output head 2 x 2880 x 201088, attention q, o (2880 x 4096), k, v
    # (2880 x 512) per layer; f32: router (+bias), expert biases, q/k/v/o biases, sinks, norms
    q8 = (2 * 2880 * 201088 + n_layer * (2 * 2880 * 4096 + 2 * 2880 * 512)) // 32 * 34
    f32 = 4 * (n_layer * (2880 * n_expert + n_expert + n_expert * (3 * 2880) + 4096 + 2 * 512 + 2880 + 64
                          + 2 * 2880) + 2880)
    assert sum(t.nbytes for t in plan.tensors if not t.expert_role) == q8 + f32
    gib = plan.total_bytes / 2**30
    assert abs(gib / PUBLISHED_GIB[name] - 1) < 0.05
    # a 1024-token vocab would drop 2 x 2880 x 200064 Q8_0 weights: 1.22 GB
    small = plan_model(dataclasses.replace(spec, n_vocab=1024))
    assert plan.total_bytes - small.total_bytes == pytest.approx(2 * 2880 * 200064 // 32 * 34, rel=0.01)


def test_dry_run_prints_the_size(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "g.gguf"
    assert bench_main(["make-model", str(out), "--shape", "gpt-oss-120b", "--dry-run"]) == 0
    printed = capsys.readouterr()
    assert printed.out.split()[1] == str(plan_model(shape_spec("gpt-oss-120b")).total_bytes)
    assert "63.38 GB" in printed.err and "gpt-oss, 36 layers, 128 experts top-4, mxfp4 experts" in printed.err
    assert not out.exists()
    assert bench_main(["make-model", str(out), "--arch", "gpt-oss", "--layers", "2"]) == 0
    capsys.readouterr()
    assert _field(GGUFReader(out), "gpt-oss.block_count") == 2


def test_layout_streams_expert_weights_and_keeps_their_biases_resident(tmp_path: Path) -> None:
    (path,) = make_model(tmp_path / "g.gguf", TINY)
    lay = load_layout(path)
    assert lay.arch == "gpt-oss" and lay.moe_layers == list(range(TINY.n_layer))
    assert sorted(lay.experts) == sorted(f"blk.{il}.ffn_{k}_exps.weight" for il in range(4)
                                         for k in ("gate", "up", "down"))
    assert [t.kind for t in lay.by_layer[0]] == ["ffn_gate_exps", "ffn_up_exps", "ffn_down_exps"]
    assert lay.row.expert_tensors[-1] == "ffn_down_exps"
    plan = plan_model(TINY)
    dense0 = sum(t.nbytes for t in plan.tensors if t.layer == 0 and not t.expert_role)
    assert lay.dense_bytes_by_layer[0] == dense0
    assert dense0 > 4 * (2 * FF + D) * E  # the expert biases are in it


def test_harmony_template_renders_through_llama_cpp_pythons_jinja_handler() -> None:
    fmt = pytest.importorskip("llama_cpp.llama_chat_format")
    f = fmt.Jinja2ChatFormatter(template=HARMONY_TEMPLATE, eos_token="<|return|>", bos_token="<|startoftext|>")
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "Hello"}, {"role": "user", "content": "Again"}]
    got = f(messages=msgs).prompt
    assert got == (
        "<|start|>system<|message|>Knowledge cutoff: 2024-06\n\nReasoning: medium\n\n# Valid channels: analysis, "
        "commentary, final. Channel must be included for every message.<|end|>"
        "<|start|>developer<|message|># Instructions\n\nBe brief.<|end|>"
        "<|start|>user<|message|>Hi<|end|>"
        "<|start|>assistant<|channel|>final<|message|>Hello<|end|>"
        "<|start|>user<|message|>Again<|end|><|start|>assistant")
    assert "Reasoning: low" in f(messages=msgs[1:2], reasoning_effort="low").prompt
    with pytest.raises(ValueError, match="unsupported role"):
        f(messages=[{"role": "tool", "content": "x"}])


# -- through llama.cpp -------------------------------------------------------------------------------------------




@pytest.mark.engine
def test_loads_generates_varied_text_and_its_sliding_window_matters(tmp_path: Path) -> None:
    pytest.importorskip("llama_cpp")
    (path,) = make_model(tmp_path / "g.gguf", TINY)
    toks = greedy(path, 48, n_ctx=256)
    assert len(toks) == 48 and len(set(toks)) >= 16 and max(toks.count(t) for t in toks) <= 12, toks
    assert not set(toks) & set(range(len(HARMONY.tokens))), "a special token was generated"
    # same weights, window 8 instead of 128: once the sequence is past 8 tokens the even layers see less
    (narrow,) = make_model(tmp_path / "w8.gguf", dataclasses.replace(TINY, n_swa=8))
    assert greedy(narrow, 48, n_ctx=256) != toks


@pytest.mark.engine
def test_chat_template_applies_through_llama_chat_apply_template(tmp_path: Path) -> None:
    L = pytest.importorskip("llama_cpp")
    (path,) = make_model(tmp_path / "g.gguf", TINY)
    llm = L.Llama(model_path=str(path), n_ctx=128, verbose=False)
    msgs = (L.llama_chat_message * 1)()
    msgs[0].role, msgs[0].content = b"user", b"Hi"
    buf = ctypes.create_string_buffer(512)

    def apply(tmpl: bytes) -> bytes | int:
        n = L.llama_chat_apply_template(tmpl, msgs, 1, True, buf, len(buf))
        return buf.value[:n] if n >= 0 else n

    # the C API knows templates by their markers only: ours is recognised as harmony and gets llama.cpp's
    # built-in harmony rendering; one it does not recognise is refused (-1), whatever Jinja it holds
    assert apply(L.llama_model_chat_template(llm.model, None)) == b"<|start|>user<|message|>Hi<|end|><|start|>assistant"
    assert apply(b"{% for m in messages %}{{ m['content'] }}{% endfor %}") == -1
    for marker in (b"<|start|>", b"<|message|>", b"<|end|>", b"<|channel|>", b"<|return|>"):
        assert len(llm.tokenize(marker, add_bos=False, special=True)) == 1, marker
    llm.close()


# -- the engine's gates (test_engine_gates.py's fixtures and helpers, on gpt-oss models) -------------------------

@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, Path]:
    """The tiny gpt-oss model with a 16-token window, so that prompt plus generation run past it."""
    d = tmp_path_factory.mktemp("gptoss")
    (path,) = make_model(d / "gpt-oss.gguf", dataclasses.replace(TINY, n_swa=16, seed=21))
    return {"gpt-oss": path}


@pytest.mark.engine
@pytest.mark.parametrize("flags", [("--cache-mb", "0"), ("--cache-mb", "1"), ("--cache-mb", "1", "--io-threads", "2"),
                                   ("--cache-mb", "1", "--no-odirect")])
def test_streamed_matches_resident(models, resident, tmp_path, flags):  # noqa: F811 (the imported fixture)
    r = _stream(models, tmp_path, "gpt-oss", *flags)
    assert r.tokens == resident("gpt-oss")
    assert r.preamble["odirect_effective"] == ("0" if "--no-odirect" in flags else "1")
    if flags[1] == "1":
        # 3 x 34816 B per expert: 1 MiB holds 10 of the 32, above one token cycle (4 layers x k=2)
        assert r.summary["evictions"] > 0, "the cache was meant to evict"
    else:
        assert r.summary["hit_pct"] == -1 and r.summary["mib_read_per_token"] > 0


@pytest.mark.engine
def test_chatml_and_top1_override_match_resident(models, resident, tmp_path):  # noqa: F811
    r = _stream(models, tmp_path, "gpt-oss", "--cache-mb", "1", "--chatml")
    assert r.tokens == resident("gpt-oss", "--chatml")
    assert resident("gpt-oss", "--chatml") != resident("gpt-oss")
    r = _stream(models, tmp_path, "gpt-oss", "--cache-mb", "0", "--n-expert-used", "1")
    assert r.tokens == resident("gpt-oss", "--n-expert-used", "1")
    assert "k=1 (read from the graph)" in r.stderr


@pytest.mark.engine
def test_negative_control_one_wrong_expert_diverges(models, resident, tmp_path):  # noqa: F811
    """One layer's slot of a routed expert filled with another expert's MXFP4 bytes (its bias row stays right):
    the gate must see it."""
    trace = tmp_path / "t.route.csv"
    _stream(models, tmp_path, "gpt-oss", "--cache-mb", "0", "--route-trace", str(trace))
    rows = [ln.split(",") for ln in trace.read_text().splitlines() if not ln.startswith("#")][1:]
    layer, expert = 1, int(next(r[5] for r in rows if r[1] == "1" and r[3] == "1"))  # used in decode
    env = {"BMOE_TEST_WRONG_EXPERT": f"{layer},{expert},{(expert + 1) % E}"}
    r = _stream(models, tmp_path, "gpt-oss", "--cache-mb", "0", env=env)
    assert r.tokens != resident("gpt-oss")
