"""The hook's taps stage: a layer's MoE input handed to whoever reads ahead.

- taps (`StreamHook.taps`, empty = no cost): at the first expert-matmul ask of each layer in a graph, the
  MUL_MAT_ID's src[1] (a reshape view of the layer's MoE input, an ancestor of the routing node, so computed and
  valid by then) is copied out as float32 [n_tok, n_embd] and every tap is called with
  (layer, phase, decode_index, hidden): the early router's input (route-ahead, predictive prefetch).

A stage of `StreamHook` (harness.engine.stream.hook), which holds the state; this class names what the stage uses.
"""

from __future__ import annotations

import ctypes
import time

import numpy as np

from harness.engine.model.ggml import GGML_MAX_SRC, GGML_TYPE_F32, OFF_NAME, OFF_SRC0, tensor_at
from harness.engine.model.gguf_layout import ModelLayout
from harness.engine.stream.common import HookError, Tap, TokenCounters, settle

_c_vp = ctypes.c_void_p
_Srcs = ctypes.c_void_p * GGML_MAX_SRC
_string_at = ctypes.string_at


class TapStage:
    layout: ModelLayout
    counters: TokenCounters
    phase: int
    decode_index: int
    taps: list[Tap]  # called with each layer's MoE input
    _tap_due: int | None  # the layer whose routing node was seen and whose input is not tapped yet
    tap_skipped: set[int]  # layers whose matmul input is not the plain MoE input (llama4)

    def _run_taps(self, t: int) -> None:
        """The layer's first expert-matmul ask: hand its MoE input (src[1]) to every tap."""
        t0, c0 = time.perf_counter_ns(), time.thread_time_ns()
        il, self._tap_due = self._tap_due, None
        assert il is not None
        src0 = _c_vp.from_address(t + OFF_SRC0).value
        if not _string_at(src0 + OFF_NAME, 24).startswith(f"blk.{il}.".encode()):
            raise HookError(f"the first expert matmul after '{self.layout.row.topk_node}-{il}' is "
                            f"{_string_at(src0 + OFF_NAME).decode()!r}, not one of layer {il}")
        x = tensor_at(_Srcs.from_address(t + OFF_SRC0)[1])
        if int(x.type) != GGML_TYPE_F32 or int(x.ne[1]) != 1 or int(x.nb[0]) != 4:
            self.tap_skipped.add(il)  # e.g. llama4 multiplies the router weights in first: not the MoE input
            settle(self.counters, t0, c0)
            return
        n_embd, n_tok, nb2 = int(x.ne[0]), int(x.ne[2]) * int(x.ne[3]), int(x.nb[2])
        buf = (ctypes.c_float * ((n_tok - 1) * (nb2 // 4) + n_embd)).from_address(x.data)
        hidden = np.lib.stride_tricks.as_strided(np.frombuffer(buf, dtype=np.float32), shape=(n_tok, n_embd),
                                                 strides=(nb2, 4)).copy()
        for tap in self.taps:
            tap(il, self.phase, self.decode_index, hidden)
        settle(self.counters, t0, c0)
