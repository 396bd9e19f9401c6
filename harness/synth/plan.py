"""The full plan of a synthetic model (pure): its tensors and metadata (the common keys here, the arch's own from
its layout module in harness.synth.archs), the split into shards and each tensor's place in its shard. Writing
follows the plan byte for byte, so sizes and expert offsets are known without writing anything."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from gguf.constants import GGUFValueType as VT

from harness.errors import UserError
from harness.synth import tokenizer as tok
from harness.synth.archs._generic import layout
from harness.synth.gguf_encode import KV, TensorInfo, align, encode_header
from harness.synth.spec import ModelSpec, validate
from harness.synth.tensors import GGML_TYPE_ID, TensorPlan

# llama_ftype by the type of the bulk of the weights (informational: llama.cpp prints it)
FILE_TYPE: dict[str, int] = {"f32": 0, "f16": 1, "q8_0": 7, "q4_k": 15, "mxfp4": 38, "q5_0": 8, "iq2_s": 28,
                             "q5_k": 17, "q6_k": 18}


@dataclass(frozen=True)
class ShardPlan:
    index: int
    tensors: tuple[int, ...]  # indices into ModelPlan.tensors
    header: bytes  # already padded: data starts at len(header)
    offsets: tuple[int, ...]  # per tensor, relative to the data section

    @property
    def data_offset(self) -> int:
        return len(self.header)


@dataclass(frozen=True)
class ModelPlan:
    spec: ModelSpec
    kvs: tuple[KV, ...]
    tensors: tuple[TensorPlan, ...]
    shards: tuple[ShardPlan, ...]
    shard_sizes: tuple[int, ...]

    @property
    def total_bytes(self) -> int:
        return sum(self.shard_sizes)


@dataclass(frozen=True)
class ExpertLocation:
    """Where one routed-expert tensor lies: expert e's slice is bytes [offset + e*nb, offset + (e+1)*nb)."""

    name: str
    layer: int
    role: str
    shard: int  # 0-based
    offset: int  # absolute, in the shard file
    nb: int  # bytes per expert (ggml nb[2])
    n_expert: int


def shard_paths(out: Path, n_split: int) -> list[Path]:
    """llama.cpp's naming (llama_split_path): PREFIX-00001-of-00003.gguf; one shard keeps OUT as given."""
    if n_split == 1:
        return [out]
    prefix = out.name[: -len(".gguf")] if out.name.endswith(".gguf") else out.name
    return [out.with_name(f"{prefix}-{i + 1:05d}-of-{n_split:05d}.gguf") for i in range(n_split)]



def plan_kvs(spec: ModelSpec) -> list[KV]:
    a = spec.arch
    sp = tok.specials_for(a, spec.chat_template)
    v = tok.build_vocab(spec.n_vocab, sp)
    u32, f32, s = VT.UINT32, VT.FLOAT32, VT.STRING
    kvs = [
        KV("general.architecture", s, a),
        KV(
            "general.name",
            s,
            f"bmoe-synth-{a}-L{spec.n_layer}-E{spec.n_expert}-{spec.expert_type}-seed{spec.seed}",
        ),
        KV("general.quantization_version", u32, 2),
        KV("general.file_type", u32, FILE_TYPE[spec.expert_type if spec.is_moe else spec.dense_type]),
        KV(f"{a}.context_length", u32, spec.ctx_len),
        KV(f"{a}.embedding_length", u32, spec.n_embd),
        KV(f"{a}.block_count", u32, spec.n_layer),
        KV(f"{a}.attention.head_count", u32, spec.n_head),
        KV(f"{a}.attention.head_count_kv", u32, spec.n_head_kv),
        KV(f"{a}.attention.key_length", u32, spec.head_dim),
        KV(f"{a}.attention.value_length", u32, spec.head_dim),
        KV(f"{a}.attention.layer_norm_rms_epsilon", f32, spec.rms_eps),
        KV(f"{a}.rope.freq_base", f32, spec.rope_freq_base),
    ]
    if spec.rope_yarn_factor > 0:
        kvs += [
            KV(f"{a}.rope.scaling.type", s, "yarn"),
            KV(f"{a}.rope.scaling.factor", f32, spec.rope_yarn_factor),
            KV(f"{a}.rope.scaling.original_context_length", u32, spec.rope_yarn_orig_ctx),
        ]
    if spec.is_moe:
        kvs += [
            KV(f"{a}.expert_count", u32, spec.n_expert),
            KV(f"{a}.expert_used_count", VT.ARRAY, list(spec.expert_used_per_layer), u32)
            if spec.expert_used_per_layer else KV(f"{a}.expert_used_count", u32, spec.n_expert_used),
        ]
    kvs += [
        KV("tokenizer.ggml.model", s, "llama"),
        KV("tokenizer.ggml.tokens", VT.ARRAY, v.tokens, s),
        KV("tokenizer.ggml.scores", VT.ARRAY, v.scores, f32),
        KV("tokenizer.ggml.token_type", VT.ARRAY, v.types, VT.INT32),
        KV("tokenizer.ggml.unknown_token_id", u32, sp.unk_id),
        KV("tokenizer.ggml.bos_token_id", u32, sp.bos_id),
        KV("tokenizer.ggml.eos_token_id", u32, sp.eos_id),
        KV("tokenizer.ggml.add_bos_token", VT.BOOL, sp.add_bos),
        KV("tokenizer.ggml.add_eos_token", VT.BOOL, False),
    ]
    if tok.TEMPLATES[spec.chat_template or tok.default_template(a)] is not None:
        kvs.append(KV("tokenizer.chat_template", s, sp.template))
    return layout(a).kvs(spec, kvs)  # the arch's own keys


def _split_kvs(index: int, n_split: int, n_tensors: int) -> list[KV]:
    return [
        KV("split.no", VT.UINT16, index),
        KV("split.count", VT.UINT16, n_split),
        KV("split.tensors.count", VT.INT32, n_tensors),
    ]


def assign_shards(sizes: list[int], n_split: int) -> list[list[int]]:
    """Contiguous runs of tensors, each shard close to total/n_split bytes, none empty."""
    if n_split > len(sizes):
        raise ValueError(f"{n_split} shards for {len(sizes)} tensors")
    total = sum(sizes)
    shards: list[list[int]] = [[] for _ in range(n_split)]
    cur, acc = 0, 0
    for i, nb in enumerate(sizes):
        remaining_tensors = len(sizes) - i
        remaining_shards = n_split - cur - 1
        must_advance = shards[cur] and remaining_tensors == remaining_shards
        wants_advance = shards[cur] and remaining_shards > 0 and acc + nb / 2 > total * (cur + 1) / n_split
        if must_advance or wants_advance:
            cur += 1
        shards[cur].append(i)
        acc += nb
    return shards


def plan_model(spec: ModelSpec) -> ModelPlan:
    validate(spec)
    tensors = layout(spec.arch).tensors(spec)
    if spec.n_split > len(tensors):
        raise UserError(f"--split {spec.n_split} is more than the model's {len(tensors)} tensors")
    kvs = plan_kvs(spec)
    groups = assign_shards([t.nbytes for t in tensors], spec.n_split)
    shards, sizes = [], []
    for si, idxs in enumerate(groups):
        # as llama.cpp's gguf-split: all metadata in the first shard, only the split keys in the others
        shard_kvs = kvs if si == 0 else []
        if spec.n_split > 1:
            shard_kvs = shard_kvs + _split_kvs(si, spec.n_split, len(tensors))
        offsets, off = [], 0
        for i in idxs:
            offsets.append(off)
            off = align(off + tensors[i].nbytes)
        infos = [
            TensorInfo(tensors[i].name, tensors[i].ne, GGML_TYPE_ID[tensors[i].dtype], o)
            for i, o in zip(idxs, offsets, strict=True)
        ]
        header = encode_header(shard_kvs, infos)
        last = tensors[idxs[-1]]
        shards.append(ShardPlan(si, tuple(idxs), header, tuple(offsets)))
        sizes.append(len(header) + align(offsets[-1] + last.nbytes))
    return ModelPlan(spec, tuple(kvs), tuple(tensors), tuple(shards), tuple(sizes))


def expert_locations(plan: ModelPlan) -> list[ExpertLocation]:
    """Every routed-expert tensor's shard, absolute offset and per-expert size, in plan order."""
    out = []
    for sh in plan.shards:
        for i, off in zip(sh.tensors, sh.offsets, strict=True):
            t = plan.tensors[i]
            if t.expert_role:
                out.append(
                    ExpertLocation(
                        t.name,
                        t.layer,
                        t.expert_role,
                        sh.index,
                        sh.data_offset + off,
                        t.nbytes // t.ne[2],
                        t.ne[2],
                    )
                )
    return out
