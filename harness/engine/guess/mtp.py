"""Guess-ahead with the model's own MTP (nextn) head (`--mtp`), through llama.cpp's MTP context type.

The MTP context (`ctx_type = LLAMA_CONTEXT_TYPE_MTP`, `ctx_other` = the trunk's context) runs only the nextn
block: at position p it takes the token x_p and the trunk's hidden state at p - 1 (before the final norm) and
predicts x_{p+1}; for a longer draft it takes its own hidden output as the next step's hidden state (a single
head chained, as llama.cpp's own drafter does). Its KV cache holds the nextn block's keys and values of every
position the trunk has decoded: after each trunk decode the pairs (x_p, h_{p-1}) of the new positions are queued
and sent with the next draft in one batch. Positions the trunk forgets (rejected drafts, a turn that keeps only
a prefix, a cleared cache) are found by comparing tokens and removed from the MTP cache too. A hidden state that
is not at hand (the first token of a turn that reused a prefix) is zeros, as in llama.cpp: it can only make a
draft worse, never the output different, since every draft is verified by the trunk.

The nextn block's weights, its routed experts included, are read through llama.cpp's file mapping (the page
cache), like dense weights: they are not streamed through the expert cache (the streaming hook is the trunk's
eval callback; the MTP context has none). The bytes this process reads from storage while the MTP context
runs are counted (/proc/self/io) and reported with the token's reads.

Two functions the drafter needs are declared only in llama.cpp's staging C++ header (llama-ext.h:
llama_set_embeddings_nextn, llama_get_embeddings_nextn): libllama exports them under their C++ (Itanium)
mangled names, which ctypes calls.
"""

from __future__ import annotations

import ctypes
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from harness.engine.io import sysstats
from harness.errors import UserError

_SET_NEXTN = "_Z26llama_set_embeddings_nextnP13llama_contextbb"
_GET_NEXTN = "_Z26llama_get_embeddings_nextnP13llama_context"
_GET_NEXTN_ITH = "_Z30llama_get_embeddings_nextn_ithP13llama_contexti"


def _mangled(L, name: str, argtypes: list, restype):
    f = getattr(L._lib, name)
    f.argtypes, f.restype = argtypes, restype
    return f


def refusal(model: str, arch: str, n_layer_nextn: int) -> str | None:
    """The one-line refusal for a model --mtp cannot draft with (read from its header), else None."""
    if n_layer_nextn < 1:
        return (f"--mtp: {model} ({arch}) has no nextn (MTP) layer to draft with; drop --mtp, or use --ngram")
    return None


@dataclass
class _Pair:
    tok: int
    pos: int
    h: np.ndarray


class MtpDrafter:
    """Drafts tokens with the MTP head of `model` for the trunk context `trunk` (n_ctx positions)."""

    def __init__(self, L, model, trunk, n_ctx: int, threads: int, last_log: Callable[[], str]):
        self.L = L
        self.trunk = trunk
        set_nextn = _mangled(L, _SET_NEXTN, [ctypes.c_void_p, ctypes.c_bool, ctypes.c_bool], None)
        self._get_nextn = _mangled(L, _GET_NEXTN, [ctypes.c_void_p], ctypes.POINTER(ctypes.c_float))
        self._get_nextn_ith = _mangled(L, _GET_NEXTN_ITH, [ctypes.c_void_p, ctypes.c_int32],
                                       ctypes.POINTER(ctypes.c_float))
        cp = L.llama_context_default_params()
        cp.n_ctx = cp.n_batch = cp.n_ubatch = n_ctx
        cp.n_seq_max = 1
        cp.n_threads = cp.n_threads_batch = threads
        cp.ctx_type, cp.ctx_other, cp.n_rs_seq = L.LLAMA_CONTEXT_TYPE_MTP, trunk, 0
        self.ctx = L.llama_init_from_model(model, cp)
        if not self.ctx:
            raise UserError(f"--mtp: llama.cpp could not make an MTP context for this model ({last_log()}); "
                            "drop --mtp")
        set_nextn(trunk, True, False)  # the trunk outputs its hidden state for every token of a batch
        set_nextn(self.ctx, True, True)  # the MTP context for its output tokens
        self.vocab = L.llama_model_get_vocab(model)
        self.n_vocab = L.llama_vocab_n_tokens(self.vocab)
        self.n_embd = L.llama_model_n_embd_out(model)
        self.batch = L.llama_batch_ext_init(self.ctx)
        self.known: list[int] = []  # the token at each position the trunk decoded (the MTP cache's or queued)
        self.flushed = 0  # positions < flushed are in the MTP cache (position 0 never is: nothing precedes it)
        self.queue: list[_Pair] = []
        self._rows = np.zeros((0, self.n_embd), np.float32)  # the trunk's last batch's hidden states
        self._rows_pos = 0  # ... and the position of its first row
        self.seconds = 0.0  # time in the MTP context
        self.read_bytes = 0  # bytes read from storage meanwhile (the nextn block's weights through the mapping)

    def close(self) -> None:
        L = self.L
        if getattr(self, "batch", None):
            L.llama_batch_ext_free(self.batch)
            self.batch = None
        if getattr(self, "ctx", None):
            L.llama_free(self.ctx)
            self.ctx = None

    # -- keeping up with the trunk --------------------------------------------------------------------------
    def _cut(self, pos: int) -> None:
        """Forget position `pos` and everything after it."""
        del self.known[pos:]
        self.queue = [q for q in self.queue if q.pos < pos]
        if self.flushed > pos:
            if not self.L.llama_memory_seq_rm(self.L.llama_get_memory(self.ctx), 0, pos, -1):
                self.L.llama_memory_clear(self.L.llama_get_memory(self.ctx), True)
                self.flushed = 0
                self.queue = []
                del self.known[:]
                return
            self.flushed = pos

    def _h(self, pos: int) -> np.ndarray:
        i = pos - self._rows_pos
        if 0 <= i < len(self._rows):
            return self._rows[i]
        return np.zeros(self.n_embd, np.float32)

    def trunk_decoded(self, toks: list[int], pos0: int) -> None:
        """The trunk has just decoded `toks` at positions pos0...: queue their pairs, keep their hidden states."""
        n = len(toks)
        if pos0 > len(self.known):  # the trunk holds positions this drafter never saw: they match nothing
            self.known += [-1] * (pos0 - len(self.known))
        i0 = 0
        while i0 < n and pos0 + i0 < len(self.known) and self.known[pos0 + i0] == toks[i0]:
            i0 += 1
        self._cut(pos0 + i0)
        base = self._get_nextn(self.trunk)
        rows = np.ctypeslib.as_array(base, shape=(n * self.n_embd,)).reshape(n, self.n_embd).copy()
        for i in range(i0, n):
            p = pos0 + i
            if p > 0:
                self.queue.append(_Pair(toks[i], p, rows[i - 1] if i else self._h(p - 1)))
            self.known.append(toks[i])
        self._rows, self._rows_pos = rows, pos0

    def forget_from(self, pos: int) -> None:
        """The trunk removed positions `pos`... (rejected drafts)."""
        self._cut(pos)

    # -- drafting ----------------------------------------------------------------------------------------------
    def _add(self, tok: int, pos: int, h: np.ndarray, out: bool, keep: list[np.ndarray]) -> int:
        L = self.L
        idx = L.llama_batch_ext_add_token(self.batch, 0, tok)
        row = np.ascontiguousarray(h, dtype=np.float32)
        keep.append(row)
        if not L.llama_batch_ext_set_embd_token(
                self.batch, idx, L.llama_embd(row.ctypes.data_as(ctypes.POINTER(ctypes.c_float)), 1, self.n_embd)):
            raise RuntimeError("llama_batch_ext_set_embd_token failed")
        L.llama_batch_ext_set_pos(self.batch, idx, (L.llama_pos * 1)(pos))
        L.llama_batch_ext_set_output_logits(self.batch, idx, out)
        return idx

    def _process(self) -> None:
        rc = self.L.llama_process(self.ctx, self.L.LLAMA_PROCESS_TYPE_DECODE, self.batch)
        self.L.llama_batch_ext_clear(self.batch)
        if rc != 0:
            raise RuntimeError(f"llama_process (MTP context) returned {rc}")

    def _argmax(self, idx: int) -> int:
        p = self.L.llama_get_logits_ith(self.ctx, idx)
        return int(np.ctypeslib.as_array(p, shape=(self.n_vocab,)).argmax())

    def draft(self, tok: int, pos: int, n: int, stop: Callable[[int], bool]) -> list[int]:
        """Up to `n` tokens after `tok`, which the trunk decodes next at `pos`; the draft ends before a token
        `stop` says ends a generation (the loop stops on such a token before decoding it)."""
        if n <= 0:
            return []
        if pos != len(self.known):
            self._cut(min(pos, len(self.known)))
            self.known += [-1] * (pos - len(self.known))
        io0, t0 = sysstats.proc_io_read_bytes(), time.perf_counter()
        keep: list[np.ndarray] = []
        try:
            for q in self.queue:
                self._add(q.tok, q.pos, q.h, False, keep)
            idx = self._add(tok, pos, self._h(pos - 1), True, keep)
            self.queue = []
            self._process()
            self.known.append(tok)
            self.flushed = pos + 1
            out: list[int] = []
            while True:
                d = self._argmax(idx)
                if stop(d):
                    break
                out.append(d)
                if len(out) >= n:
                    break
                h = np.ctypeslib.as_array(self._get_nextn_ith(self.ctx, idx), shape=(self.n_embd,)).copy()
                keep.clear()
                idx = self._add(d, pos + len(out), h, True, keep)
                self._process()
            if len(out) > 1:  # the chained steps' entries are drafts, not the trunk's: the verify batch redoes them
                self.L.llama_memory_seq_rm(self.L.llama_get_memory(self.ctx), 0, pos + 1, -1)
            return out
        finally:
            io1 = sysstats.proc_io_read_bytes()
            self.seconds += time.perf_counter() - t0
            if io0 >= 0 and io1 >= 0:
                self.read_bytes += io1 - io0
