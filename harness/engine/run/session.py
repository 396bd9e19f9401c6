"""The llama.cpp adapter: the context over a model loaded before it (harness.engine.run.llama_model), with the eval
callback of the parts built between the two (harness.engine.compose's order); then, for whoever drives tokens
(harness.engine.run.token_loop, harness.engine.diag.batch_exact), a public surface over llama.cpp: tokenize, decode,
logits, sample (`Sampler`, the one sampler chain), end of generation, forget the KV cache's entries. No flag parsing
(cli.py), no wiring of parts (compose.py), no rows or summaries (token_loop), no printing (cli.py)."""

from __future__ import annotations

import ctypes
import os
import re
import time
from dataclasses import dataclass, fields, replace

import numpy as np

from harness.engine.config import EngineConfig
from harness.engine.guess.mtp import MtpDrafter
from harness.engine.io import sysstats
from harness.engine.model.prompt import build_prompt
from harness.engine.run.llama_model import EngineError, LoadedModel, last_log, log_lines
from harness.engine.run.parts import Parts

__all__ = ["EngineError", "LoadedModel", "Sampler", "Sampling", "Session"]  # EngineError: where it was first declared

MIB = 1048576


@dataclass(frozen=True)
class Sampling:
    """How the next token is chosen: greedy at temp 0, else top-k, top-p, temperature and a seeded draw. The
    defaults are the flags' (harness.engine.config.fields); a request may override them (`of`)."""

    n_predict: int
    temp: float
    top_k: int
    top_p: float
    seed: int

    @classmethod
    def of(cls, cfg: EngineConfig, **over: object) -> Sampling:
        """The engine flags' sampling, with the given values over it (None = keep the flag's)."""
        base = cls(**{f.name: getattr(cfg, f.name) for f in fields(cls)})
        return replace(base, **{k: v for k, v in over.items() if v is not None})


_COMPUTE_BUF_RE = re.compile(r"compute buffer size\s*=\s*([0-9.]+) MiB")


def compute_buffer_bytes(lines) -> int | None:
    """What llama.cpp reserved for its compute graph, from its own log lines of the context's creation (the
    buffer is reserved there and first touched by the first decode, so the process's RSS at load does not show
    it yet); None when the log does not say."""
    sizes = [float(m.group(1)) for s in lines if (m := _COMPUTE_BUF_RE.search(s))]
    return int(sum(sizes) * 1048576) if sizes else None


class Sampler:
    """One llama.cpp sampler chain over a session's context (the only place one is built); `close()` frees it."""

    def __init__(self, L, ctx, sp: Sampling):
        self.L, self.ctx = L, ctx
        ch = L.llama_sampler_chain_init(L.llama_sampler_chain_default_params())
        if sp.temp <= 0:
            L.llama_sampler_chain_add(ch, L.llama_sampler_init_greedy())
        else:
            L.llama_sampler_chain_add(ch, L.llama_sampler_init_top_k(sp.top_k))
            L.llama_sampler_chain_add(ch, L.llama_sampler_init_top_p(sp.top_p, 1))
            L.llama_sampler_chain_add(ch, L.llama_sampler_init_temp(sp.temp))
            L.llama_sampler_chain_add(ch, L.llama_sampler_init_dist(sp.seed))
        self.chain = ch

    def sample(self, i: int = -1) -> int:
        """The token chosen from the logits of the last decode's output `i` (-1: its last)."""
        return self.L.llama_sampler_sample(self.chain, self.ctx, i)

    def close(self) -> None:
        if self.chain is not None:
            self.L.llama_sampler_free(self.chain)
            self.chain = None


class Session:
    """The context over a loaded model (`loaded`, which it owns from now on), with the streaming parts' hook as its
    eval callback (`parts.hook`; None: the plain mmap run). The parts are built before it (harness.engine.compose's
    order) and stay theirs: the session reads `parts.hook` and `parts.dense` (the dense weights' resident fraction
    per token) and closes neither."""

    def __init__(self, loaded: LoadedModel, parts: Parts):
        self.L, self.cfg, self.layout = loaded.L, loaded.cfg, loaded.layout
        self.loaded, self.parts = loaded, parts
        self.model, self.vocab, self.load, self.prompt = loaded.model, loaded.vocab, loaded.load, loaded.prompt
        self.mtp: MtpDrafter | None = None  # --mtp: the MTP head's drafter
        self.psi_path, self.psi_source = sysstats.psi_memory_path()  # mem_stall_ms per token
        try:
            self._make_context()
        except BaseException:
            self.close()
            raise
        self.load_s = time.perf_counter() - loaded.t0  # the load, the parts built after it, this context

    # -- llama.cpp plumbing -----------------------------------------------------------------------
    def last_log(self) -> str:
        return last_log()

    def _make_context(self) -> None:
        L = self.L
        cp = L.llama_context_default_params()
        cp.n_ctx = self.cfg.ctx
        cp.n_batch = self.cfg.ctx
        cp.n_ubatch = self.cfg.ctx
        cp.n_seq_max = 1
        # --flash-attn off by default: its CPU kernel splits a one-token decode's KV over the threads once the
        # cache holds 512+ cells (another summation order than a batch's rows get), so a verify batch (--ngram,
        # --mtp) would not be bit-exact against one-token decoding (harness.engine.guess.exactness)
        cp.flash_attn_type = {"off": L.LLAMA_FLASH_ATTN_TYPE_DISABLED, "on": L.LLAMA_FLASH_ATTN_TYPE_ENABLED,
                              "auto": L.LLAMA_FLASH_ATTN_TYPE_AUTO}[self.cfg.flash_attn]
        # 0: one compute thread per core this process may run on (llama.cpp's own default is 4 whatever the
        # machine; on 2 cores -t 2 beat -t 1 by 1.07x with 4 read lanes, bench-data/2026-12-01-threads-lanes)
        threads = self.cfg.threads or len(os.sched_getaffinity(0))
        cp.n_threads = threads
        cp.n_threads_batch = threads
        hook = self.parts.hook
        if hook is not None:
            cp.cb_eval = hook.cfunc
            cp.cb_eval_user_data = hook.user_data
        self.ctx = L.llama_init_from_model(self.model, cp)
        if not self.ctx:
            raise EngineError(f"llama.cpp could not create a context: {self.last_log()}")
        self.compute_buffer_bytes = compute_buffer_bytes(log_lines())
        if self.cfg.mtp:
            self.mtp = MtpDrafter(L, self.model, self.ctx, self.cfg.ctx, threads, self.last_log)

    def close(self) -> None:
        L = self.L
        if getattr(self, "mtp", None):
            self.mtp.close()
            self.mtp = None
        if getattr(self, "ctx", None):
            L.llama_free(self.ctx)
            self.ctx = None
        self.loaded.close()
        self.model = None

    # -- text ----------------------------------------------------------------------------------------
    def prompt_text(self) -> str:
        return self.prompt.text

    def build(self, text: str) -> str:
        """Another prompt as it would be sent (chat template, --no-think), for a --prompts-file turn."""
        cfg = self.cfg
        return build_prompt(cfg.model, self.layout.chat_template, text, chatml=cfg.chatml,
                            no_think=cfg.no_think).text

    def clear_memory(self) -> None:
        """Forget the previous generation (the KV cache), keeping the model, the context and the hook."""
        self.L.llama_memory_clear(self.L.llama_get_memory(self.ctx), True)

    def tokenize(self, text: str) -> list[int]:
        L = self.L
        raw = text.encode()
        n_max = len(raw) + 16  # enough for most vocabularies; a byte-level one may need more (a space can
        # be three byte tokens): llama_tokenize then returns minus the count it needs, and we retry once
        for _ in range(2):
            arr = (L.llama_token * n_max)()
            n = L.llama_tokenize(self.vocab, raw, len(raw), arr, n_max, True, True)
            if n >= 0:
                return list(arr[:n])
            if n == -(2**31):  # the count overflows int32
                break
            n_max = -n
        raise EngineError(f"tokenization failed: llama_tokenize returned {n} for a {len(raw)}-byte prompt")

    def piece(self, tok: int) -> bytes:
        buf = ctypes.create_string_buffer(256)
        n = self.L.llama_token_to_piece(self.vocab, tok, buf, 256, 0, False)
        return buf.raw[: max(n, 0)]

    def sampler(self, sp: Sampling) -> Sampler:
        return Sampler(self.L, self.ctx, sp)

    def is_eog(self, tok: int) -> bool:
        """Whether `tok` ends a generation (end of sequence, end of turn)."""
        return bool(self.L.llama_vocab_is_eog(self.vocab, tok))

    @property
    def n_vocab(self) -> int:
        return self.L.llama_vocab_n_tokens(self.vocab)

    def logits(self, i: int) -> np.ndarray:
        """A copy of the last decode's logits for its output `i` (-1: its last)."""
        p = self.L.llama_get_logits_ith(self.ctx, i)
        return np.ctypeslib.as_array(p, shape=(self.n_vocab,)).copy()

    def bos_to_add(self) -> int:
        """The BOS token the vocabulary puts first (llama_vocab_get_add_bos), or -1 when it adds none."""
        L = self.L
        return int(L.llama_vocab_bos(self.vocab)) if L.llama_vocab_get_add_bos(self.vocab) else -1

    def output_logits(self, n: int) -> np.ndarray:
        """A copy of the last decode's first `n` output rows of logits, (n, n_vocab) float32, in batch order."""
        p = self.L.llama_get_logits(self.ctx)
        return np.ctypeslib.as_array(p, shape=(n, self.n_vocab)).copy()

    def decode(self, toks: list[int], all_logits: bool = False, logits_from: int | None = None) -> None:
        """Decode `toks` after what the KV cache holds; logits for the last token, for every one (`all_logits`),
        or for those from index `logits_from` on (teacher-forced scoring, harness.engine.run.fidelity)."""
        L = self.L
        arr = (L.llama_token * len(toks))(*toks)
        batch = L.llama_batch_get_one(arr, len(toks))
        if all_logits or logits_from is not None:
            lo = 0 if all_logits else logits_from
            out = (ctypes.c_int8 * len(toks))(*([0] * lo + [1] * (len(toks) - lo)))
            batch.logits = ctypes.cast(out, ctypes.POINTER(ctypes.c_int8))
        hook = self.parts.hook
        tr = hook.tracing if hook is not None else None
        if tr is not None:
            tr.decode_begin()
        pos0 = L.llama_memory_seq_pos_max(L.llama_get_memory(self.ctx), 0) + 1 if self.mtp else 0
        rc = L.llama_decode(self.ctx, batch)
        if tr is not None:
            tr.decode_end()
        if hook is not None:
            hook.raise_if_failed()
        if rc != 0:
            raise EngineError(f"llama_decode returned {rc}: {self.last_log()}")
        if self.mtp:
            self.mtp.trunk_decoded(toks, pos0)

    def forget_from(self, pos: int) -> None:
        """Remove the KV cache's entries from position `pos` on (rejected guesses)."""
        L = self.L
        if not L.llama_memory_seq_rm(L.llama_get_memory(self.ctx), 0, pos, -1):
            raise EngineError(f"llama.cpp could not remove the KV cache's entries from position {pos}")
        if self.mtp:
            self.mtp.forget_from(pos)

    def keep_prefix(self, n: int) -> int:
        """Keep the KV cache's first `n` positions and remove the rest; returns how many are kept: `n`, or 0
        when llama.cpp cannot remove a part and the whole cache is cleared instead. The MTP drafter is not told:
        it compares the positions the trunk decodes next with those it holds (MtpDrafter.trunk_decoded)."""
        L = self.L
        mem = L.llama_get_memory(self.ctx)
        if not L.llama_memory_seq_rm(mem, 0, n, -1):
            L.llama_memory_clear(mem, True)
            return 0
        return n
