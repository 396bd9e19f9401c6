"""The llama.cpp adapter: load the model, install the eval callback it is given, make the context; then, for
whoever drives tokens (harness.engine.run.token_loop, harness.engine.diag.batch_exact), a public surface over
llama.cpp: tokenize, decode, logits, sample (`Sampler`, the one sampler chain), end of generation, forget the
KV cache's entries. No flag parsing (config), no wiring of parts (compose.py), no rows or summaries (token_loop),
no printing (cli.py)."""

from __future__ import annotations

import ctypes
import os
import re
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, fields, replace

import numpy as np

from harness.engine.config import EngineConfig
from harness.engine.guess.mtp import MtpDrafter
from harness.engine.io import lazymap, sysstats
from harness.engine.io.dense import DenseWeights
from harness.engine.model.gguf_layout import ModelLayout
from harness.engine.model.prompt import build_prompt
from harness.engine.stream.hook import StreamHook
from harness.errors import EngineFailed, UserError
from harness.formats.metrics_csv import UNMEASURED
from harness.formats.partial_import import submodule_alone

MIB = 1048576


class EngineError(EngineFailed, RuntimeError):
    """A failure inside the engine (not the user's input): exit 3."""


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


# llama.cpp's log lines, the last 50 (for a failed load's message). The callback is made once and kept for the
# process's life: llama.cpp keeps the pointer after a session closes, and a freed one crashes the next load in
# this process (an in-process llama-cpp-python Llama after a Session did: tests/gates/test_bailingmoe3.py)
_LOG_LINES: deque[str] = deque(maxlen=50)
_LOG_CB = None


def _on_log(level, text, _ud) -> None:
    try:
        s = text.decode("utf-8", "replace").strip()
        if s:
            _LOG_LINES.append(s)
    except Exception:  # noqa: BLE001 - never raise into C
        pass


_COMPUTE_BUF_RE = re.compile(r"compute buffer size\s*=\s*([0-9.]+) MiB")


def compute_buffer_bytes(lines) -> int | None:
    """What llama.cpp reserved for its compute graph, from its own log lines of the context's creation (the
    buffer is reserved there and first touched by the first decode, so the process's RSS at load does not show
    it yet); None when the log does not say."""
    sizes = [float(m.group(1)) for s in lines if (m := _COMPUTE_BUF_RE.search(s))]
    return int(sum(sizes) * 1048576) if sizes else None


def _log_callback(L):
    global _LOG_CB
    if _LOG_CB is None:
        _LOG_CB = L.llama_log_callback(_on_log)
    return _LOG_CB


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


@dataclass(frozen=True)
class LoadFacts:
    """What `llama_model_load_from_file` cost: bytes this process read from storage meanwhile (/proc/self/io
    read_bytes; page-cache hits are not reads; -1 where unreadable), its wall time, and how the file was mapped."""

    read_bytes: int
    seconds: float
    mode: lazymap.LoadMode

    def preamble(self) -> dict[str, object]:
        return {"load_read_bytes": self.read_bytes, "load_model_ms": round(self.seconds * 1e3, 3),
                "load_populate": int(self.mode.populate), "load_populate_note": self.mode.note}


class Session:
    """`make_hook` is called after the model is loaded and before the context is made (the eval callback is
    fixed per context); it returns the hook to install, or None for the plain mmap run. `dense` measures the
    dense weights' resident fraction per token."""

    def __init__(self, cfg: EngineConfig, layout: ModelLayout,
                 make_hook: Callable[[], StreamHook | None] = lambda: None, dense: DenseWeights | None = None):
        L = submodule_alone("llama_cpp.llama_cpp")  # the ctypes bindings, without the package's __init__

        self.L = L
        self.cfg = cfg
        self.layout = layout
        self.hook: StreamHook | None = None
        self.mtp: MtpDrafter | None = None  # --mtp: the MTP head's drafter
        self.dense = dense
        self.psi_path, self.psi_source = sysstats.psi_memory_path()  # mem_stall_ms per token
        self._log = _LOG_LINES
        self._log.clear()
        # from the file's header, before the slow load: a template that cannot do what was asked is refused now
        self.prompt = build_prompt(cfg.model, layout.chat_template, cfg.prompt, chatml=cfg.chatml,
                                   no_think=cfg.no_think)
        L.llama_log_set(_log_callback(L), ctypes.c_void_p(0))
        L.llama_backend_init()
        t0 = time.perf_counter()
        try:
            self._load_model()
            self.hook = make_hook()
            self._make_context()
        except BaseException:
            self.close()
            raise
        self.load_s = time.perf_counter() - t0

    # -- llama.cpp plumbing -----------------------------------------------------------------------
    def last_log(self) -> str:
        for s in reversed(self._log):
            if "error" in s.lower() or "failed" in s.lower():
                return s
        return self._log[-1] if self._log else ""

    def _load_model(self) -> None:
        L = self.L
        mp = L.llama_model_default_params()
        mp.load_mode = 1  # LLAMA_LOAD_MODE_MMAP
        mp.lazy_mode = 0  # LLAMA_LAZY_MODE_OFF: expert tensors must be plain CPU tensors we can rebind
        mp.use_extra_bufts = False  # repacked Q4_0/Q4_K layouts would break rebinding (non-finite logits)
        mp.check_tensors = False  # validation would read every tensor, experts included, through the mapping
        mp.n_gpu_layers = 0
        mp.load_mtp = self.cfg.mtp  # the nextn (MTP) block's tensors, for harness.engine.guess.mtp
        self._kv = None
        if self.cfg.n_expert_used:
            arr = (L.llama_model_kv_override * 2)()
            arr[0].tag = L.LLAMA_KV_OVERRIDE_TYPE_INT
            arr[0].key = f"{self.layout.arch}.expert_used_count".encode()
            arr[0].value.val_i64 = self.cfg.n_expert_used
            arr[1].key = b""
            self._kv = arr  # must stay alive during load
            mp.kv_overrides = ctypes.cast(arr, ctypes.POINTER(L.llama_model_kv_override))
        io0, t0 = sysstats.proc_io_read_bytes(), time.perf_counter()
        with lazymap.unpopulated(list(self.layout.shards),
                                 lazymap.wants_populate(self.cfg.load_populate, self.cfg.moe_stream)) as mode:
            self.model = L.llama_model_load_from_file(str(self.layout.shards[0]).encode(), mp)
        io1 = sysstats.proc_io_read_bytes()
        self.load = LoadFacts(io1 - io0 if io0 >= 0 and io1 >= 0 else UNMEASURED, time.perf_counter() - t0, mode[0])
        if not self.model:
            raise EngineError(f"llama.cpp could not load {self.cfg.model}: {self.last_log()}")
        self.vocab = L.llama_model_get_vocab(self.model)
        guess = "--ngram" if self.cfg.ngram else "--mtp" if self.cfg.mtp else ""
        if guess and (L.llama_model_is_recurrent(self.model) or L.llama_model_is_hybrid(self.model)):
            raise UserError(f"{guess}: {self.cfg.model} keeps a recurrent state, which cannot drop rejected "
                            f"guesses; drop {guess}")

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
        if self.hook is not None:
            cp.cb_eval = self.hook.cfunc
            cp.cb_eval_user_data = self.hook.user_data
        self.ctx = L.llama_init_from_model(self.model, cp)
        if not self.ctx:
            raise EngineError(f"llama.cpp could not create a context: {self.last_log()}")
        self.compute_buffer_bytes = compute_buffer_bytes(self._log)
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
        if getattr(self, "model", None):
            L.llama_model_free(self.model)
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
        tr = self.hook.tracing if self.hook is not None else None
        if tr is not None:
            tr.decode_begin()
        pos0 = L.llama_memory_seq_pos_max(L.llama_get_memory(self.ctx), 0) + 1 if self.mtp else 0
        rc = L.llama_decode(self.ctx, batch)
        if tr is not None:
            tr.decode_end()
        if self.hook is not None:
            self.hook.raise_if_failed()
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
