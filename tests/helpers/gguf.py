"""GGUF files for the loader's refusal tests: a header naming the tensors, the file sized to hold them, no weights
written (enough for the layout reader to read and refuse)."""

from __future__ import annotations

from pathlib import Path

from gguf.constants import GGUFValueType as VT

from harness.synth.gguf_encode import KV, TensorInfo, encode_header


def header_only(path: Path, arch: str, tensors: list[tuple[str, tuple[int, ...]]], n_expert: int = 8) -> Path:
    kvs = [KV("general.architecture", VT.STRING, arch), KV(f"{arch}.expert_count", VT.UINT32, n_expert),
           KV(f"{arch}.expert_used_count", VT.UINT32, 2), KV(f"{arch}.block_count", VT.UINT32, 1)]
    infos, off = [], 0
    for name, ne in tensors:
        infos.append(TensorInfo(name, ne, 0, off))
        n = 4
        for d in ne:
            n *= d
        off += (n + 31) // 32 * 32
    header = encode_header(kvs, infos)
    with open(path, "wb") as f:
        f.write(header)
        f.truncate(len(header) + off)
    return path


def with_kv(src: Path, dst: Path, key: str, value: int | None = None, rename: str | None = None) -> Path:
    """A copy of a generated model with one scalar metadata value changed in place (gguf's own reader, opened for
    writing), or its key renamed to one of the same length (the key then missing): a damaged header."""
    import shutil

    from gguf import GGUFReader

    shutil.copy(src, dst)
    r = GGUFReader(dst, "r+")
    f = r.fields[key]
    if rename is not None:
        assert len(rename) == len(key)
        f.parts[1][:] = list(rename.encode())
    else:
        f.parts[f.data[0]][0] = value
    r.data.flush()
    del r
    return dst
