"""The GGUF metadata value types: the `gguf` package's GGUFValueType, and the little-endian struct format
of each fixed-size one (STRING and ARRAY are variable-length: a u64 length, or a u32 element type and a u64
count, then the items). The synthetic-model encoder and the engine's header parser both use this table."""

from __future__ import annotations

from harness.formats.partial_import import submodule_alone

GGUFValueType = submodule_alone("gguf.constants").GGUFValueType  # without gguf's __init__ (partial_import)

__all__ = ["GGUFValueType", "SCALAR_FORMAT", "scalar_format"]

SCALAR_FORMAT: dict[GGUFValueType, str] = {
    GGUFValueType.UINT8: "<B",
    GGUFValueType.INT8: "<b",
    GGUFValueType.UINT16: "<H",
    GGUFValueType.INT16: "<h",
    GGUFValueType.UINT32: "<I",
    GGUFValueType.INT32: "<i",
    GGUFValueType.FLOAT32: "<f",
    GGUFValueType.BOOL: "<?",
    GGUFValueType.UINT64: "<Q",
    GGUFValueType.INT64: "<q",
    GGUFValueType.FLOAT64: "<d",
}


def scalar_format(vtype: int) -> str | None:
    """The struct format of a fixed-size value type given as its number in the file, or None (STRING,
    ARRAY, or a number this gguf version does not know). A plain dict lookup: GGUFValueType is an IntEnum,
    so the number finds its member (this runs once per vocabulary entry when a header is parsed)."""
    return SCALAR_FORMAT.get(vtype)  # type: ignore[call-overload]
