"""The hook's one-token fast path reads a routing node through a small ctypes view of `struct ggml_tensor`
(harness.engine.stream.route._TopkHead) and writes a replayed row as prepacked int32 bytes
(harness.engine.routing.route_replay.DecodeRow): both must match the full mirror and numpy's int32 layout."""

from __future__ import annotations

import ctypes

import numpy as np

from harness.engine.model.ggml import GGML_TYPE_I32, GgmlTensor
from harness.engine.routing.route_replay import _decode_row
from harness.engine.stream.route import _TopkHead


def test_the_topk_view_reads_the_mirrors_fields():
    t = GgmlTensor()
    ids = (ctypes.c_int32 * 12)(*range(12))
    t.type, t.name, t.data = GGML_TYPE_I32, b"ffn_moe_topk-47", ctypes.addressof(ids)
    for i, (ne, nb) in enumerate([(6, 4), (2, 24), (1, 48), (1, 48)]):
        t.ne[i], t.nb[i] = ne, nb
    t.op, t.view_offs, t.flags = 37, 123, -1  # fields between the ones read: must not leak into them
    h = _TopkHead.from_address(ctypes.addressof(t))
    assert (h.type, h.ne0, h.ne1, h.nb1, h.data, h.name) == (
        t.type, t.ne[0], t.ne[1], t.nb[1], t.data, b"ffn_moe_topk-47")
    assert ctypes.sizeof(_TopkHead) <= ctypes.sizeof(GgmlTensor)
    t.name = b"ffn_moe_topk-3"  # a shorter name over a longer one: the view reads up to the NUL, as the mirror
    assert h.name == t.name == b"ffn_moe_topk-3"


def test_a_decode_row_is_packed_as_int32():
    ids = [127, 0, 5, 5, 64, 3]
    r = _decode_row(ids)
    assert r.ids == ids and (r.lo, r.hi) == (0, 127)
    assert r.packed == np.asarray(ids, dtype=np.int32).tobytes()
    buf = (ctypes.c_int32 * len(ids))()
    (ctypes.c_char * len(r.packed)).from_address(ctypes.addressof(buf)).raw = r.packed
    assert list(buf) == ids
