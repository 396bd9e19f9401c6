"""Where every expert slice lies on disk: a small GGUF header parser (v2/v3) across shards.

Reads only headers (metadata and tensor infos), never tensor data, so it is instant on a 17 GB file.
Absolute offset of a tensor = that shard's data offset + the tensor's offset; expert e's slice is at
+ e * nb2, nb2 bytes long (nb2 = bytes of one expert matrix).
"""

from __future__ import annotations

import os
import re
import struct
from dataclasses import dataclass, field
from pathlib import Path

from harness.engine.model.llama_archs import LLAMA_ARCHS
from harness.engine.model.registry import FUSED_EXPERTS, STANDARD, ArchRow, row_for, supported
from harness.errors import UserError
from harness.formats.gguf_types import GGUFValueType, scalar_format
from harness.formats.partial_import import submodule_alone

_GGUF = submodule_alone("gguf.constants")  # without gguf's __init__ (harness.formats.partial_import)
GGML_QUANT_SIZES, GGMLQuantizationType = _GGUF.GGML_QUANT_SIZES, _GGUF.GGMLQuantizationType

_SPLIT_RE = re.compile(r"^(?P<prefix>.*)-(?P<no>\d{5})-of-(?P<count>\d{5})\.gguf$")


class _Truncated(Exception):
    pass


class _Reader:
    def __init__(self, f):
        self.f = f

    def read(self, n: int) -> bytes:
        b = self.f.read(n)
        if len(b) != n:
            raise _Truncated()
        return b

    def u32(self) -> int:
        return struct.unpack("<I", self.read(4))[0]

    def u64(self) -> int:
        return struct.unpack("<Q", self.read(8))[0]

    def string(self) -> str:
        n = self.u64()
        if n > 1 << 24:
            raise _Truncated()
        return self.read(n).decode("utf-8", "replace")

    def value(self, vtype: int, keep: bool):
        fmt = scalar_format(vtype)
        if fmt is not None:
            return struct.unpack(fmt, self.read(struct.calcsize(fmt)))[0]
        if vtype == GGUFValueType.STRING:
            return self.string()
        if vtype == GGUFValueType.ARRAY:
            itype, n = self.u32(), self.u64()
            ifmt = scalar_format(itype)
            if ifmt is not None:  # skip fixed-size arrays in one seek
                size = struct.calcsize(ifmt) * n
                if keep:
                    return list(struct.unpack(f"<{n}{ifmt[1]}", self.read(size)))
                self.f.seek(size, os.SEEK_CUR)
                return None
            items = [self.value(itype, keep) for _ in range(n)]
            return items if keep else None
        raise _Truncated()


@dataclass
class TensorInfo:
    name: str
    shape: tuple[int, ...]  # ggml order: ne[0], ne[1], ...
    ggml_type: int
    shard: int
    abs_offset: int
    nbytes: int


@dataclass
class ShardHeader:
    path: Path
    kv: dict[str, object]
    tensors: list[TensorInfo]
    data_offset: int
    file_size: int


def _nbytes(shape: tuple[int, ...], ggml_type: int) -> int:
    blk, tsize = GGML_QUANT_SIZES[GGMLQuantizationType(ggml_type)]
    n = 1
    for d in shape:
        n *= d
    return n // blk * tsize


_KEEP_ARRAYS = (".expert_used_count",)  # key suffixes whose array values are kept (per-layer top-k)


def read_header(path: Path, shard: int = 0) -> ShardHeader:
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            r = _Reader(f)
            if r.read(4) != b"GGUF":
                raise UserError(f"{path}: not a GGUF file (bad magic); pass a .gguf model")
            version = r.u32()
            if version not in (2, 3):
                raise UserError(f"{path}: GGUF version {version} is not supported (2 or 3)")
            n_tensors, n_kv = r.u64(), r.u64()
            kv: dict[str, object] = {}
            for _ in range(n_kv):
                key = r.string()
                vtype = r.u32()
                kv[key] = r.value(vtype, keep=key.endswith(_KEEP_ARRAYS))
            raw = []
            for _ in range(n_tensors):
                name = r.string()
                nd = r.u32()
                shape = tuple(r.u64() for _ in range(nd))
                raw.append((name, shape, r.u32(), r.u64()))
            align = int(kv.get("general.alignment", 32) or 32)
            pos = f.tell()
            data_offset = (pos + align - 1) // align * align
    except _Truncated:
        raise UserError(
            f"{path}: truncated GGUF header; the file is incomplete, download or generate it again") from None
    except PermissionError:
        raise UserError(f"{path}: permission denied; make the model file readable (chmod a+r)") from None
    except FileNotFoundError:
        raise UserError(f"{path}: no such model file; check the -m path") from None
    except IsADirectoryError:
        raise UserError(f"{path}: is a directory; pass the .gguf file (first shard of a split model)") from None
    tensors = []
    for name, shape, gtype, off in raw:
        try:
            nb = _nbytes(shape, gtype)
        except (ValueError, KeyError):
            raise UserError(f"{path}: tensor {name} has unknown ggml type {gtype}") from None
        tensors.append(TensorInfo(name, shape, gtype, shard, data_offset + off, nb))
    end = max((t.abs_offset + t.nbytes for t in tensors), default=data_offset)
    if end > size:
        raise UserError(
            f"{path}: truncated GGUF: tensor data ends at byte {end} but the file has {size} bytes; "
            "the file is incomplete, download or generate it again"
        )
    return ShardHeader(path, kv, tensors, data_offset, size)


def shard_paths(first: Path, kv: dict[str, object]) -> list[Path]:
    count = int(kv.get("split.count", 1) or 1)
    if count <= 1:
        return [first]
    m = _SPLIT_RE.match(first.name)
    if not m or int(m.group("no")) != 1:
        raise UserError(f"{first}: split model ({count} shards): pass the first shard, NAME-00001-of-{count:05d}.gguf")
    prefix = first.parent / m.group("prefix")
    paths = [Path(f"{prefix}-{i:05d}-of-{count:05d}.gguf") for i in range(1, count + 1)]
    for p in paths:
        if not p.exists():
            raise UserError(f"{p}: missing shard {paths.index(p) + 1} of {count}; put every shard beside the first")
    return paths


@dataclass
class ExpertTensor:
    layer: int
    kind: str  # e.g. ffn_gate_exps
    name: str
    path: Path
    abs_offset: int
    nbytes: int
    nb2: int  # bytes per expert
    n_expert: int
    shape: tuple[int, ...]
    ggml_type: int


@dataclass(frozen=True)
class DenseTensor:
    """A tensor that is not a streamed routed expert (attention, norms, router, embeddings, biases...)."""

    name: str
    path: Path
    abs_offset: int
    nbytes: int
    shape: tuple[int, ...]
    ggml_type: int


@dataclass
class ModelLayout:
    arch: str
    row: ArchRow
    n_layer: int
    n_expert: int
    n_expert_used: int
    shards: list[Path]
    file_bytes: int
    experts: dict[str, ExpertTensor] = field(default_factory=dict)  # by tensor name
    by_layer: dict[int, list[ExpertTensor]] = field(default_factory=dict)
    dense_bytes_by_layer: dict[int, int] = field(default_factory=dict)
    nonexpert_bytes: int = 0
    chat_template: str = ""  # tokenizer.chat_template ("" when the file has none)
    dense: dict[str, DenseTensor] = field(default_factory=dict)  # every non-expert tensor, by name
    # layout facts from the file (all but the routed experts stay resident)
    n_layer_nextn: int = 0  # nextn (MTP) layers: the last ones of block_count, not part of the trunk
    expert_used_by_layer: tuple[int, ...] = ()  # top-k per layer (an expert_used_count array, or one value)
    expert_used_is_array: bool = False  # the file gives expert_used_count per layer
    nextn_bytes: int = 0  # bytes of the nextn layers' tensors (loaded by llama.cpp only for MTP)
    shared_experts: tuple[str, ...] = ()  # ffn_*_shexp tensors (resident)
    companions: tuple[str, ...] = ()  # .scale/.bias of routed-expert tensors (resident)

    @property
    def n_layer_trunk(self) -> int:
        return self.n_layer - self.n_layer_nextn

    def facts(self) -> str:
        """The layout facts beyond plain routed experts in every layer, in one line ("" when there are none)."""
        out = []
        if self.dense_layers:
            out.append(f"dense layers {self.dense_layers} (no experts)")
        if self.n_layer_nextn:
            out.append(f"{self.n_layer_nextn} nextn (MTP) layer(s) not in the trunk ({self.nextn_bytes / 1048576:.1f} "
                       "MiB, not loaded)")
        if self.shared_experts:
            out.append(f"{len(self.shared_experts)} shared-expert tensors resident")
        if self.companions:
            out.append(f"{len(self.companions)} expert .scale/.bias companions resident")
        if self.expert_used_is_array:
            out.append(f"top-k per layer {list(self.expert_used_by_layer)}")
        return "; ".join(out)

    @property
    def dense_layers(self) -> list[int]:
        """Trunk layers without routed experts (leading dense blocks and the like): resident."""
        return [il for il in range(self.n_layer_trunk) if il not in self.by_layer]
    # layers that select experts by token id (a blk.<il>.ffn_gate_tid2eid table: deepseek4's hash routing); their
    # ffn_moe_topk node is a GET_ROWS of that table
    token_routed_layers: tuple[int, ...] = ()

    @property
    def moe_layers(self) -> list[int]:
        return sorted(self.by_layer)

    def expert_bytes(self, layer: int) -> int:
        """Bytes of one expert of this layer (all its streamed matrices)."""
        return sum(t.nb2 for t in self.by_layer.get(layer, ()))

    def expert_bytes_per_layer(self) -> list[int]:
        return [self.expert_bytes(il) for il in range(self.n_layer)]

    @property
    def expert_total_bytes(self) -> int:
        return sum(t.nbytes for t in self.experts.values())


# blk.<il>.<name>.<suffix>: only a `.weight` of a streamed name is a routed-expert tensor; its `.bias`
# companions (gpt-oss) and every other per-layer tensor are dense bytes of that layer
_BLK_RE = re.compile(r"^blk\.(\d+)\.(.+)\.(weight|bias|scale)$")
_NEXTN_RE = re.compile(r"^blk\.(\d+)\.")  # any tensor of a block, whatever its suffix (blk.<il>.ssm_a has none)


def _int(v: object) -> int:
    return int(v or 0) if not isinstance(v, list) else max((int(x) for x in v), default=0)


def _expert_used(kv: dict[str, object], arch: str, n_layer: int, n_expert: int,
                 path: Path) -> tuple[tuple[int, ...], bool]:
    """The top-k per layer, checked here because llama.cpp aborts the process (an assert, no error) on a
    missing, zero or above-expert_count value."""
    key = f"{arch}.expert_used_count"
    if key not in kv:
        raise UserError(f"{path}: no {key} in the GGUF metadata of a MoE model ({arch}.expert_count is "
                        f"{n_expert}); the file is damaged or was written incompletely, convert it again")
    v = kv[key]
    values = v if isinstance(v, list) else [v]
    if not all(isinstance(x, int) and not isinstance(x, bool) for x in values):
        raise UserError(f"{path}: {key} is not an integer; the file is damaged, convert it again")
    # a per-layer array may hold 0 for a layer without experts (checked against the layers in load_layout)
    low = 0 if isinstance(v, list) else 1
    bad = next((x for x in values if not low <= x <= n_expert), None)
    if bad is not None or max(values, default=0) < 1:
        raise UserError(f"{path}: {key} is {v if bad is None else bad}, outside 1..{n_expert} ({arch}.expert_count); "
                        "the file is damaged, convert it again")
    if isinstance(v, list):
        if len(v) != n_layer:
            raise UserError(f"{path}: {key} has {len(v)} values for {n_layer} layers")
        return tuple(int(x) for x in v), True
    return (int(v),) * n_layer, False


def _unknown_layout(path: Path, arch: str, names: list[str]) -> UserError:
    kinds = sorted({m.group(2) for n in names if (m := _BLK_RE.match(n)) and m.group(2).endswith("_exps")})
    found = f"its expert tensors are {', '.join(kinds)}" if kinds else "it has no *_exps expert tensors"
    return UserError(f"{path}: MoE architecture '{arch}' has an expert layout bmoe does not know ({found}); "
                     f"supported: {', '.join(STANDARD)} per layer (bmoe --list-archs)")


def load_layout(model: Path | str) -> ModelLayout:
    """Parse every shard's header and resolve the routed-expert tensors. Refuses, with one line naming what is
    supported, a dense model, an architecture llama.cpp cannot load and an unknown expert layout."""
    first = Path(model)
    h0 = read_header(first, 0)
    arch = str(h0.kv.get("general.architecture", "") or "")
    if not arch:
        raise UserError(f"{first}: no general.architecture in the GGUF metadata; not a llama.cpp model")
    if arch not in LLAMA_ARCHS:
        raise UserError(f"{first}: architecture '{arch}' is not one the pinned llama.cpp can load; bmoe streams "
                        f"MoE models llama.cpp loads whose experts follow its standard names ({supported()} are "
                        "tested; bmoe --list-archs)")
    n_expert = int(h0.kv.get(f"{arch}.expert_count", 0) or 0)
    if n_expert <= 1:
        raise UserError(
            f"{first}: '{arch}' is a dense model (no routed experts); bmoe streams MoE models "
            f"({supported()}); run it with plain llama.cpp"
        )
    row = row_for(arch)
    paths = shard_paths(first, h0.kv)
    headers = [h0] + [read_header(p, i) for i, p in enumerate(paths[1:], start=1)]
    n_layer = int(h0.kv.get(f"{arch}.block_count", 0) or 0)
    used, is_arr = _expert_used(h0.kv, arch, n_layer, n_expert, first)
    n_nextn = int(h0.kv.get(f"{arch}.nextn_predict_layers", 0) or 0)
    if not 0 <= n_nextn < n_layer:
        raise UserError(f"{first}: {arch}.nextn_predict_layers is {n_nextn} of {n_layer} layers")
    lay = ModelLayout(
        arch=arch, row=row, n_layer=n_layer, n_expert=n_expert,
        n_expert_used=_int(h0.kv.get(f"{arch}.expert_used_count")),
        shards=paths, file_bytes=sum(h.file_size for h in headers),
        chat_template=str(h0.kv.get("tokenizer.chat_template", "") or ""),
        n_layer_nextn=n_nextn, expert_used_by_layer=used, expert_used_is_array=is_arr,
    )
    # a fused tensor (gate_up) stands for its parts wherever the file has it
    fused = {f: parts for f, parts in FUSED_EXPERTS.items() if set(parts) <= set(row.expert_tensors)}
    streamed = set(row.expert_tensors) | set(fused)
    shexp, comp = [], []
    for h in headers:
        for t in h.tensors:
            blk = _NEXTN_RE.match(t.name)
            if blk and lay.n_layer_nextn and int(blk.group(1)) >= lay.n_layer_trunk:
                lay.nextn_bytes += t.nbytes  # not part of the trunk's graph: neither streamed nor resident
                continue
            m = _BLK_RE.match(t.name)
            if m and m.group(2).endswith("_shexp"):
                shexp.append(t.name)
            elif m and m.group(2) in streamed and m.group(3) != "weight":
                comp.append(t.name)
            if m and m.group(2) in streamed and m.group(3) == "weight":
                il = int(m.group(1))
                if len(t.shape) != 3 or t.shape[2] != n_expert:
                    raise UserError(f"{h.path}: {t.name} has shape {t.shape}, expected [*, *, {n_expert}] experts")
                et = ExpertTensor(il, m.group(2), t.name, h.path, t.abs_offset, t.nbytes,
                                  t.nbytes // n_expert, n_expert, t.shape, t.ggml_type)
                lay.experts[t.name] = et
                lay.by_layer.setdefault(il, []).append(et)
            else:
                lay.nonexpert_bytes += t.nbytes
                lay.dense[t.name] = DenseTensor(t.name, h.path, t.abs_offset, t.nbytes, t.shape, t.ggml_type)
                if m:
                    il = int(m.group(1))
                    lay.dense_bytes_by_layer[il] = lay.dense_bytes_by_layer.get(il, 0) + t.nbytes
    lay.shared_experts, lay.companions = tuple(shexp), tuple(comp)
    lay.token_routed_layers = tuple(sorted(
        int(m.group(1)) for name in lay.dense if (m := _BLK_RE.match(name)) and m.group(2) == "ffn_gate_tid2eid"))
    if not lay.experts:
        raise _unknown_layout(first, arch, [t.name for h in headers for t in h.tensors])
    for il, ts in lay.by_layer.items():
        if il < n_layer and not lay.expert_used_by_layer[il]:
            raise UserError(f"{first}: {arch}.expert_used_count is 0 for layer {il}, which has experts; the file "
                            "is damaged, convert it again")
        kinds = sorted(t.kind for t in ts)
        want = set(row.expert_tensors)
        for f, parts in fused.items():
            if f in kinds:
                want = (want - set(parts)) | {f}
        if kinds != sorted(want):
            raise UserError(f"{first}: layer {il} has expert tensors {kinds}, expected {sorted(want)}; "
                            "an expert layout bmoe does not know (bmoe --list-archs)")
    return lay
