"""harness.synth without llama.cpp: plan, header encoding, block validity, determinism, shards, CLI errors."""

from __future__ import annotations

import dataclasses
import hashlib
import math
from pathlib import Path

import numpy as np
import pytest
from gguf import GGUFReader
from gguf.constants import GGMLQuantizationType as QT
from gguf.quants import dequantize

from harness.bench_cli import main as bench_main
from harness.errors import UserError
from harness.synth import ModelSpec, expert_locations, make_model, plan_model, shard_paths
from harness.synth.fill import CHUNK_BYTES, quantize_q8_0, tensor_chunks
from harness.synth.plan import assign_shards
from harness.synth.shapes import shape_spec
from harness.synth.tokenizer import build_vocab


def _sha(paths: list[Path]) -> list[str]:
    return [hashlib.sha256(p.read_bytes()).hexdigest() for p in paths]


def _field(r: GGUFReader, key: str):
    return r.fields[key].contents()


def test_same_spec_same_bytes_other_seed_other_bytes(tmp_path: Path) -> None:
    spec = ModelSpec(seed=7, n_split=2)
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    a = make_model(tmp_path / "a" / "m.gguf", spec)
    b = make_model(tmp_path / "b" / "m.gguf", spec)
    assert [p.name for p in a] == [p.name for p in b] == ["m-00001-of-00002.gguf", "m-00002-of-00002.gguf"]
    assert _sha(a) == _sha(b)
    c = make_model(tmp_path / "c.gguf", dataclasses.replace(spec, seed=8, n_split=1))
    d = make_model(tmp_path / "d.gguf", dataclasses.replace(spec, n_split=1))
    assert _sha(c) != _sha(d)


@pytest.mark.parametrize("arch", ["qwen3moe", "qwen2moe", "qwen3", "olmoe"])
@pytest.mark.parametrize("expert_type", ["f32", "q8_0", "q4_k"])
def test_file_matches_plan(tmp_path: Path, arch: str, expert_type: str) -> None:
    spec = ModelSpec(arch=arch, expert_type=expert_type, dense_type="f16", n_head_kv=4 if arch == "olmoe" else 2)
    plan = plan_model(spec)
    (path,) = make_model(tmp_path / "m.gguf", spec)
    assert path.stat().st_size == plan.total_bytes
    r = GGUFReader(path)
    assert _field(r, "general.architecture") == arch
    assert _field(r, f"{arch}.block_count") == spec.n_layer
    assert _field(r, f"{arch}.embedding_length") == spec.n_embd
    assert _field(r, "tokenizer.ggml.model") == "llama"
    assert len(_field(r, "tokenizer.ggml.tokens")) == spec.n_vocab
    assert "<|im_start|>" in _field(r, "tokenizer.chat_template")
    if arch == "qwen3":
        assert "qwen3.expert_count" not in r.fields
        assert not any("exps" in t.name for t in r.tensors)
    else:
        assert _field(r, f"{arch}.expert_count") == spec.n_expert
        assert _field(r, f"{arch}.expert_used_count") == spec.n_expert_used
    assert any(t.name.endswith("_shexp.weight") for t in r.tensors) == (arch == "qwen2moe")
    by_name = {t.name: t for t in r.tensors}
    assert list(by_name) == [t.name for t in plan.tensors]
    for t in plan.tensors:
        rt = by_name[t.name]
        assert tuple(int(x) for x in rt.shape) == t.ne
        assert rt.n_bytes == t.nbytes
        assert rt.data_offset % 32 == 0
    for loc in expert_locations(plan):
        rt = by_name[loc.name]
        assert loc.offset == rt.data_offset
        assert loc.nb * loc.n_expert == rt.n_bytes
        assert rt.tensor_type == {"f32": QT.F32, "q8_0": QT.Q8_0, "q4_k": QT.Q4_K}[expert_type]
    # one expert slice read through the locations equals the reader's view of that expert
    if arch != "qwen3":
        loc = expert_locations(plan)[-1]
        with open(path, "rb") as f:
            f.seek(loc.offset + 3 * loc.nb)
            got = f.read(loc.nb)
        assert got == bytes(np.ascontiguousarray(by_name[loc.name].data[3]).view(np.uint8).reshape(-1))


def test_shards_carry_split_keys_and_all_tensors(tmp_path: Path) -> None:
    spec = ModelSpec(n_split=3)
    paths = make_model(tmp_path / "x.gguf", spec)
    assert paths == shard_paths(tmp_path / "x.gguf", 3)
    assert [p.name for p in paths] == [f"x-0000{i}-of-00003.gguf" for i in (1, 2, 3)]
    names: list[str] = []
    for i, p in enumerate(paths):
        r = GGUFReader(p)
        assert _field(r, "split.no") == i
        assert _field(r, "split.count") == 3
        assert _field(r, "split.tensors.count") == len(plan_model(spec).tensors)
        assert len(r.tensors) >= 1
        names += [t.name for t in r.tensors]
    assert names == [t.name for t in plan_model(spec).tensors]
    # shards are balanced by bytes: none more than twice the mean
    sizes = [p.stat().st_size for p in paths]
    assert max(sizes) < 2 * sum(sizes) / 3
    # expert tensors end up in more than one shard
    assert len({loc.shard for loc in expert_locations(plan_model(spec))}) > 1


def test_assign_shards_contiguous_nonempty() -> None:
    assert assign_shards([1, 1, 1], 3) == [[0], [1], [2]]
    assert assign_shards([100, 1, 1, 1], 2) == [[0], [1, 2, 3]]
    assert assign_shards([1, 1, 1, 100], 3) == [[0, 1], [2], [3]]
    groups = assign_shards([5] * 20, 4)
    assert [len(g) for g in groups] == [5, 5, 5, 5]


def test_q4k_blocks_are_valid_and_scaled() -> None:
    spec = ModelSpec(expert_type="q4_k")
    t = next(t for t in plan_model(spec).tensors if t.expert_role == "down")
    raw = np.frombuffer(b"".join(tensor_chunks(t, 0)), dtype=np.uint8)
    assert raw.size == t.nbytes == t.n_elements // 256 * 144
    blocks = raw.reshape(-1, 144)
    d = blocks[:, 0:2].copy().view("<f2").astype(np.float32).ravel()
    dmin = blocks[:, 2:4].copy().view("<f2").astype(np.float32).ravel()
    assert np.all(np.isfinite(d)) and np.all(d > 0) and np.all(np.isfinite(dmin)) and np.all(dmin > 0)
    x = dequantize(raw.reshape(-1, t.row_bytes), QT.Q4_K)
    assert x.shape == (t.n_elements // t.ne[0], t.ne[0])
    assert np.all(np.isfinite(x))
    assert abs(float(x.mean())) < 0.1 * t.std
    assert 0.85 * t.std < float(x.std()) < 1.15 * t.std


def test_q8_blocks_scaled_and_own_quantizer_matches_gguf() -> None:
    spec = ModelSpec(expert_type="q8_0")
    t = next(t for t in plan_model(spec).tensors if t.expert_role == "gate")
    raw = np.frombuffer(b"".join(tensor_chunks(t, 0)), dtype=np.uint8)
    x = dequantize(raw.reshape(-1, t.row_bytes), QT.Q8_0)
    assert 0.85 * t.std < float(x.std()) < 1.15 * t.std
    rows = np.random.default_rng(1).standard_normal((4, 64)).astype(np.float32)
    ours = dequantize(quantize_q8_0(rows).reshape(4, -1), QT.Q8_0)
    assert np.max(np.abs(ours - rows)) < np.abs(rows).max() / 127 + 1e-3


def test_output_rows_of_control_tokens_are_zero() -> None:
    spec = ModelSpec(dense_type="f32")
    t = next(t for t in plan_model(spec).tensors if t.name == "output.weight")
    w = np.frombuffer(b"".join(tensor_chunks(t, spec.seed)), dtype="<f4").reshape(spec.n_vocab, spec.n_embd)
    ctrl = build_vocab(spec.n_vocab).control_ids
    assert ctrl == [0, 1, 2, 3, 4]
    assert not w[ctrl].any()
    assert np.all(np.abs(w[5:]).sum(axis=1) > 0)


def test_vocab_is_byte_level_and_unique() -> None:
    for n in (261, 320, 1024, 5000):
        v = build_vocab(n)
        assert len(v.tokens) == len(set(v.tokens)) == len(v.scores) == len(v.types) == n
        assert v.tokens[5:261] == [f"<0x{b:02X}>" for b in range(256)]


def test_qwen3_30b_a3b_plan_without_writing() -> None:
    spec = shape_spec("qwen3-30b-a3b")
    plan = plan_model(spec)
    assert (spec.n_layer, spec.n_expert, spec.n_expert_used, spec.n_embd, spec.n_ff_exp) == (48, 128, 8, 2048, 768)
    assert (spec.n_head, spec.n_head_kv, spec.head_dim, spec.expert_type) == (32, 4, 128, "q4_k")
    locs = expert_locations(plan)
    assert len(locs) == 48 * 3
    shapes = {t.name: t.ne for t in plan.tensors}
    assert shapes["blk.47.ffn_gate_exps.weight"] == (2048, 768, 128)
    assert shapes["blk.47.ffn_down_exps.weight"] == (768, 2048, 128)
    assert shapes["blk.0.attn_q.weight"] == (2048, 32 * 128)
    assert shapes["blk.0.attn_k.weight"] == (2048, 4 * 128)
    assert shapes["blk.0.ffn_gate_inp.weight"] == (2048, 128)
    # Q4_K: 144 bytes per 256 weights; one expert = gate + up + down
    per_expert = 3 * 2048 * 768 // 256 * 144
    assert {loc.nb for loc in locs} == {2048 * 768 // 256 * 144}
    expert_total = sum(t.nbytes for t in plan.tensors if t.expert_role)
    assert expert_total == 48 * 128 * per_expert
    dense_total = sum(t.nbytes for t in plan.tensors if not t.expert_role)
    assert plan.total_bytes > expert_total + dense_total  # plus the header and padding
    assert plan.total_bytes - expert_total - dense_total < 1 << 20
    assert 16.0e9 < plan.total_bytes < 18.0e9


def test_chunks_are_bounded() -> None:
    t = next(t for t in plan_model(shape_spec("qwen3-30b-a3b")).tensors if t.expert_role == "up")
    it = tensor_chunks(t, 0)
    first = [next(it) for _ in range(3)]
    assert all(len(c) <= CHUNK_BYTES for c in first)
    assert math.ceil(t.nbytes / len(first[0])) > 10  # the 113 MB tensor really is streamed in pieces


@pytest.mark.parametrize(
    ("fields", "flag"),
    [
        (dict(expert_type="q4_k", n_ff_exp=300), "--expert-ff"),
        (dict(expert_type="q4_k", n_embd=320, head_dim=80), "--embd"),
        (dict(n_expert_used=9), "--top-k"),
        (dict(n_vocab=100), "--vocab"),
        (dict(arch="mixtral"), "--arch"),
        (dict(expert_type="q3_k"), "--expert-type"),  # q5_k and q6_k are written since the lfm2 shapes
        (dict(n_head=4, n_head_kv=3), "--heads-kv"),
        (dict(arch="qwen2moe", head_dim=32), "--head-dim"),
        (dict(n_split=1000), "--split"),
    ],
)
def test_bad_specs_name_the_flag(fields: dict, flag: str) -> None:
    with pytest.raises(UserError, match=flag):
        plan_model(dataclasses.replace(ModelSpec(), **fields))


def test_cli_writes_refuses_overwrite_and_reports_bad_flags(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "m.gguf"
    assert bench_main(["make-model", str(out), "--layers", "2", "--split", "2", "--seed", "3"]) == 0
    printed = capsys.readouterr()
    shards = [tmp_path / "m-00001-of-00002.gguf", tmp_path / "m-00002-of-00002.gguf"]
    assert printed.out.split() == [str(shards[0]), str(shards[0].stat().st_size),
                                   str(shards[1]), str(shards[1].stat().st_size)]
    assert "wrote 2 file(s)" in printed.err
    assert _sha(shards) == _sha(make_model(tmp_path / "api.gguf", ModelSpec(n_layer=2, n_split=2, seed=3)))

    assert bench_main(["make-model", str(out), "--layers", "2", "--split", "2"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--force" in err and "Traceback" not in err
    assert bench_main(["make-model", str(out), "--layers", "2", "--split", "2", "--force", "--seed", "4"]) == 0
    assert _sha(shards) != _sha(make_model(tmp_path / "api.gguf", ModelSpec(n_layer=2, n_split=2, seed=3)))
    capsys.readouterr()

    assert bench_main(["make-model", str(tmp_path / "q.gguf"), "--expert-type", "q4_k", "--expert-ff", "400"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--expert-ff 400" in err
    assert not (tmp_path / "q.gguf").exists()

    assert bench_main(["make-model", str(tmp_path / "nodir" / "q.gguf")]) == 2
    assert "does not exist" in capsys.readouterr().err

    assert bench_main(["make-model", str(tmp_path / "big.gguf"), "--shape", "qwen3-30b-a3b", "--dry-run"]) == 0
    printed = capsys.readouterr()
    assert printed.out.split()[1] == str(plan_model(shape_spec("qwen3-30b-a3b")).total_bytes)
    assert not (tmp_path / "big.gguf").exists()


def test_shape_flags_override() -> None:
    s = shape_spec("qwen3-30b-a3b", n_layer=2, expert_type=None)
    assert (s.n_layer, s.n_expert, s.expert_type) == (2, 128, "q4_k")
    with pytest.raises(UserError, match="--shape"):
        shape_spec("nope")


def test_prefetch_keeps_order_raises_errors_and_stops_early() -> None:
    from harness.synth.prefetch import prefetch

    assert list(prefetch(iter(range(100)), depth=2)) == list(range(100))

    def boom():
        yield 1
        raise OSError("disk full")

    it = prefetch(boom())
    assert next(it) == 1
    with pytest.raises(OSError, match="disk full"):
        next(it)

    produced: list[int] = []

    def counting():
        for i in range(1000):
            produced.append(i)
            yield i

    it = prefetch(counting(), depth=2)
    assert next(it) == 0
    it.close()  # the worker must stop, not run the generator to the end
    assert len(produced) < 10


def test_progress_goes_to_stderr_and_does_not_change_bytes(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    (quiet,) = make_model(tmp_path / "q.gguf", ModelSpec(n_layer=2))
    (shown,) = make_model(tmp_path / "p.gguf", ModelSpec(n_layer=2), progress=True)
    captured = capsys.readouterr()
    assert captured.out == ""
    assert "writing p.gguf" in captured.err
    assert _sha([quiet]) == _sha([shown])
