"""Encode a GGUF v3 header (key/values and tensor infos) to bytes (pure).

Written here rather than through gguf.GGUFWriter so that the header, with every tensor's offset, is known
before any data exists: the writer then streams tensor data in chunks and the plan can say where each
expert lies without reading the file.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from gguf.constants import GGUF_DEFAULT_ALIGNMENT, GGUF_MAGIC, GGUF_VERSION

from harness.formats.gguf_types import SCALAR_FORMAT, GGUFValueType

ALIGNMENT = GGUF_DEFAULT_ALIGNMENT  # 32; we never write general.alignment


@dataclass(frozen=True)
class KV:
    key: str
    vtype: GGUFValueType
    value: Any
    subtype: GGUFValueType | None = None  # element type of an ARRAY


@dataclass(frozen=True)
class TensorInfo:
    name: str
    ne: tuple[int, ...]  # ggml order: ne[0] is the contiguous row length
    ggml_type: int
    offset: int  # relative to the start of the data section, a multiple of ALIGNMENT


def align(n: int, a: int = ALIGNMENT) -> int:
    return (n + a - 1) // a * a


def _str(s: str) -> bytes:
    b = s.encode("utf-8")
    return struct.pack("<Q", len(b)) + b


def _value(vtype: GGUFValueType, value: Any, subtype: GGUFValueType | None) -> bytes:
    if vtype == GGUFValueType.STRING:
        return _str(value)
    if vtype == GGUFValueType.ARRAY:
        if subtype is None:
            raise ValueError("an ARRAY value needs a subtype")
        head = struct.pack("<IQ", int(subtype), len(value))
        if subtype == GGUFValueType.STRING:
            return head + b"".join(_str(v) for v in value)
        fmt = SCALAR_FORMAT[subtype]
        return head + struct.pack(f"<{len(value)}{fmt[1]}", *value)
    return struct.pack(SCALAR_FORMAT[vtype], value)


def encode_kv(kv: KV) -> bytes:
    return _str(kv.key) + struct.pack("<I", int(kv.vtype)) + _value(kv.vtype, kv.value, kv.subtype)


def encode_tensor_info(ti: TensorInfo) -> bytes:
    out = _str(ti.name) + struct.pack("<I", len(ti.ne)) + struct.pack(f"<{len(ti.ne)}Q", *ti.ne)
    return out + struct.pack("<IQ", ti.ggml_type, ti.offset)


def encode_header(kvs: Sequence[KV], tensors: Sequence[TensorInfo]) -> bytes:
    """Magic, version, counts, key/values, tensor infos, zero padding up to the data section."""
    parts = [struct.pack("<IIQQ", GGUF_MAGIC, GGUF_VERSION, len(tensors), len(kvs))]
    parts += [encode_kv(kv) for kv in kvs]
    parts += [encode_tensor_info(ti) for ti in tensors]
    raw = b"".join(parts)
    return raw + b"\0" * (align(len(raw)) - len(raw))
