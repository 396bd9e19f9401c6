"""Deterministic tensor bytes, generated in bounded chunks (pure: returns bytes, writes nothing).

Each chunk has its own seed, derived from the model seed, the tensor name and the chunk index, so a tensor's
bytes depend on nothing else (not on the chunk order, progress, or other tensors). Quantised expert tensors
are random blocks with sane f16 scales rather than quantised gaussians: that is valid, much faster, and
the dot products have the intended spread.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterator

import numpy as np

from harness.synth.tensors import BLOCK, TensorPlan

CHUNK_BYTES = 8 << 20  # upper bound on one generated chunk (plus the float32 work array for "normal")

# RMS of a random value in a random block, in units of the block scale d:
# Q8_0: q uniform on [-128, 127]; Q4_K: d*sc*q - dmin*m with sc, m uniform 6-bit, q uniform 4-bit and
# dmin = 7.5*d so that the mean is zero (see _SCALED).
_Q8_RMS = float(np.sqrt((256**2 - 1) / 12 + 0.25))
_Q5_0_RMS = float(np.sqrt((32**2 - 1) / 12 + 0.25))  # (q - 16) for q uniform on 0..31
_Q4K_DMIN_RATIO = 7.5
_Q4K_RMS = float(np.sqrt((63 * 127 / 6) * (15 * 31 / 6) - (31.5 * 7.5) ** 2 + 7.5**2 * (64**2 - 1) / 12))
# Q5_K: as Q4_K with 5-bit quants (q uniform on 0..31) and dmin = 15.5*d for a zero mean. Q6_K: int8 sub-block
# scales sc, 6-bit quants q, value d*sc*(q - 32).
_Q5K_DMIN_RATIO = 15.5
_Q5K_RMS = float(np.sqrt((63 * 127 / 6) * (31 * 63 / 6) - (31.5 * 15.5) ** 2 + 15.5**2 * (64**2 - 1) / 12))
_Q6K_RMS = float(np.sqrt(((256**2 - 1) / 12 + 0.25) * ((64**2 - 1) / 12 + 0.25)))


# MXFP4 (block_mxfp4: one E8M0 exponent byte e, then 32 4-bit E2M1 codes): value = code_value * 2^(e - 128), with
# code values 0, 1, 2, 3, 4, 6, 8, 12 and their negatives (ggml's kvalues_mxfp4, which are the E2M1 values doubled).
_MXFP4_VALUES = np.array([0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12], dtype=np.float64)
_MXFP4_RMS = float(np.sqrt(np.mean(_MXFP4_VALUES**2)))


def _rng(seed: int, name: str, chunk: int) -> np.random.Generator:
    return np.random.default_rng(np.random.SeedSequence([seed, zlib.crc32(name.encode()), chunk]))


def rows_per_chunk(t: TensorPlan) -> int:
    return max(1, CHUNK_BYTES // max(t.row_bytes, 4 * t.ne[0]))


def n_rows(t: TensorPlan) -> int:
    return t.n_elements // t.ne[0]


def _random_bytes(rng: np.random.Generator, n: int) -> np.ndarray:
    """n random bytes, writable; the raw 64-bit stream is ~6x faster than Generator.bytes."""
    raw = rng.bit_generator.random_raw((n + 7) // 8).astype("<u8", copy=False)
    return raw.view(np.uint8)[:n]


# Random blocks of a type with one f16 scale d per block (and, for the K-quants with mins, an f16 dmin right
# after it): dtype -> (the RMS of a value in units of d, the byte offset of d, dmin / d or 0 for none). Every bit
# pattern of the other bytes is valid, so they are plain random bytes.
#   block_q8_0: f16 d, 32 int8 quants
#   block_q5_0: f16 d, 4 bytes of high bits, 16 bytes of low nibbles; value = d * (q - 16)
#   block_q4_K: f16 d, f16 dmin, 12 bytes of packed 6-bit scales/mins, 128 bytes of 4-bit quants
#   block_q5_K: f16 d, f16 dmin, 12 bytes of 6-bit scales/mins, 32 bytes of high bits, 128 of low nibbles
#   block_q6_K: 128 bytes of low nibbles, 64 of high 2-bit pairs, 16 int8 scales, then f16 d (last)
_SCALED: dict[str, tuple[float, int, float]] = {
    "q8_0": (_Q8_RMS, 0, 0.0),
    "q5_0": (_Q5_0_RMS, 0, 0.0),
    "q4_k": (_Q4K_RMS, 0, _Q4K_DMIN_RATIO),
    "q5_k": (_Q5K_RMS, 0, _Q5K_DMIN_RATIO),
    "q6_k": (_Q6K_RMS, 208, 0.0),
}


def _f16_bytes(x: np.ndarray) -> np.ndarray:
    return x.astype("<f2").view(np.uint8).reshape(len(x), 2)


def _scaled_blocks(rng: np.random.Generator, dtype: str, n_blocks: int, std: float) -> np.ndarray:
    """n_blocks random blocks of `dtype` whose values have RMS about std: scales around std/rms (+-25%)."""
    rms, at, dmin_ratio = _SCALED[dtype]
    size = BLOCK[dtype][1]
    blocks = _random_bytes(rng, n_blocks * size).reshape(n_blocks, size)
    d = rng.uniform(0.75, 1.25, n_blocks) * (std / rms)
    blocks[:, at : at + 2] = _f16_bytes(d)
    if dmin_ratio:
        blocks[:, at + 2 : at + 4] = _f16_bytes(d * dmin_ratio)
    return blocks


def mxfp4_exponent(std: float) -> float:
    """The (fractional) E8M0 exponent whose blocks of uniform random codes have RMS `std`."""
    return 128.0 + float(np.log2(std / _MXFP4_RMS))


def _mxfp4_blocks(rng: np.random.Generator, n_blocks: int, std: float) -> np.ndarray:
    # every code nibble is valid, so the 16 code bytes are plain random bytes; the exponent byte is not: a random
    # one would scale by up to 2^127. It is the target exponent rounded up or down at random (stochastic
    # rounding, so the mean scale follows std): two neighbouring exponents, 119-124 for std 1/64..1/5.
    blocks = _random_bytes(rng, n_blocks * 17).reshape(n_blocks, 17)
    t = mxfp4_exponent(std)
    blocks[:, 0] = np.clip(np.floor(t + rng.random(n_blocks)), 1, 254).astype(np.uint8)
    return blocks


def quantize_q8_0(x: np.ndarray) -> np.ndarray:
    """Rows of float32 (n, k), k % 32 == 0 -> Q8_0 blocks as uint8 (n * k/32, 34): d = max|x|/127."""
    b = x.reshape(-1, 32).astype(np.float32)
    amax = np.abs(b).max(axis=1)
    d = (amax / 127.0).astype(np.float16)
    inv = np.divide(1.0, d.astype(np.float32), out=np.zeros_like(amax), where=d != 0)
    q = np.clip(np.rint(b * inv[:, None]), -127, 127).astype(np.int8)
    out = np.empty((b.shape[0], 34), dtype=np.uint8)
    out[:, 0:2] = d.astype("<f2").view(np.uint8).reshape(-1, 2)
    out[:, 2:] = q.view(np.uint8)
    return out


def _normal_rows(t: TensorPlan, rng: np.random.Generator, r0: int, r1: int) -> np.ndarray:
    x = rng.standard_normal((r1 - r0, t.ne[0]), dtype=np.float32)
    x *= np.float32(t.std)
    for r in t.zero_rows:
        if r0 <= r < r1:
            x[r - r0] = 0.0
    return x


def tensor_chunks(t: TensorPlan, seed: int) -> Iterator[bytes]:
    """The tensor's bytes, in order, in chunks of whole rows; sum of lengths == t.nbytes."""
    rows, per = n_rows(t), rows_per_chunk(t)
    blk, _ = BLOCK[t.dtype]
    for ci, r0 in enumerate(range(0, rows, per)):
        r1 = min(rows, r0 + per)
        if t.init == "ones":
            yield np.ones((r1 - r0) * t.ne[0], dtype="<f4").tobytes()
            continue
        if t.init == "const":
            yield np.full((r1 - r0) * t.ne[0], t.std, dtype="<f4").tobytes()
            continue
        rng = _rng(seed, t.name, ci)
        if t.init == "expert_ids":  # each row: ne[0] distinct expert ids in [0, std)
            ids = np.argsort(rng.random((r1 - r0, int(t.std))), axis=1)[:, : t.ne[0]]
            yield ids.astype("<i4").tobytes()
            continue
        if t.init == "one_plus":
            yield (1.0 + _normal_rows(t, rng, r0, r1)).astype("<f4").tobytes()
            continue
        if t.init == "blocks":
            n_blocks = (r1 - r0) * t.ne[0] // blk
            if t.dtype == "mxfp4":
                yield _mxfp4_blocks(rng, n_blocks, t.std).tobytes()
            elif t.dtype in _SCALED:
                yield _scaled_blocks(rng, t.dtype, n_blocks, t.std).tobytes()
            else:
                raise ValueError(f"random blocks of {t.dtype}")
            continue
        if t.init == "eye":  # row r: std at column r (a scaled identity over the first ne[1] columns)
            x = np.zeros((r1 - r0, t.ne[0]), dtype=np.float32)
            r = np.arange(r0, r1)
            x[(r - r0)[r < t.ne[0]], r[r < t.ne[0]]] = t.std
        else:
            x = _normal_rows(t, rng, r0, r1)
        if t.dtype == "f32":
            yield x.astype("<f4").tobytes()
        elif t.dtype == "f16":
            yield x.astype("<f2").tobytes()
        elif t.dtype == "q8_0":
            yield quantize_q8_0(x).tobytes()
        else:
            raise ValueError(f"gaussian {t.dtype}")
