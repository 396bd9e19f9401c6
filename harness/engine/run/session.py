"""One engine run through llama.cpp's public API: load the model, install the eval callback it is given,
prefill, decode token by token, yield one `TokenRow` per token. No flag parsing (config.py), no wiring of
parts (compose.py), no printing (cli.py)."""

from __future__ import annotations

import ctypes
import gc
import os
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from harness.engine.config import EngineConfig
from harness.engine.guess.mtp import MtpDrafter
from harness.engine.io import lazymap, sysstats
from harness.engine.io.dense import DenseWeights
from harness.engine.model.gguf_layout import ModelLayout
from harness.engine.model.prompt import build_prompt
from harness.engine.run.token_loop import TokenLoop
from harness.engine.stream.hook import StreamHook, TokenCounters
from harness.errors import UserError
from harness.formats.metrics_csv import UNMEASURED, Summary, TokenRow

MIB = 1048576


class EngineError(RuntimeError):
    """A failure inside the engine (not the user's input)."""


@dataclass
class RunResult:
    tokens: list[int] = field(default_factory=list)
    summary: Summary = field(default_factory=Summary)
    k_effective: int | None = None
    eog: bool = False  # the model ended the generation (else -n was reached)
    prompt_tokens: list[int] = field(default_factory=list)


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
        from llama_cpp import llama_cpp as L

        self.L = L
        self.cfg = cfg
        self.layout = layout
        self.hook: StreamHook | None = None
        self.mtp: MtpDrafter | None = None  # --mtp: the MTP head's drafter
        self.dense = dense
        self.result: RunResult | None = None  # set when run() has yielded its last row
        self.psi_path, self.psi_source = sysstats.psi_memory_path()  # mem_stall_ms per token
        self._log: deque[str] = deque(maxlen=50)
        # from the file's header, before the slow load: a template that cannot do what was asked is refused now
        self.prompt = build_prompt(cfg.model, layout.chat_template, cfg.prompt, chatml=cfg.chatml,
                                   no_think=cfg.no_think)
        self._log_cb = L.llama_log_callback(self._on_log)
        L.llama_log_set(self._log_cb, ctypes.c_void_p(0))
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
    def _on_log(self, level, text, _ud) -> None:
        try:
            s = text.decode("utf-8", "replace").strip()
            if s:
                self._log.append(s)
        except Exception:  # noqa: BLE001 - never raise into C
            pass

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

    def _sampler(self):
        L = self.L
        ch = L.llama_sampler_chain_init(L.llama_sampler_chain_default_params())
        c = self.cfg
        if c.temp <= 0:
            L.llama_sampler_chain_add(ch, L.llama_sampler_init_greedy())
        else:
            L.llama_sampler_chain_add(ch, L.llama_sampler_init_top_k(c.top_k))
            L.llama_sampler_chain_add(ch, L.llama_sampler_init_top_p(c.top_p, 1))
            L.llama_sampler_chain_add(ch, L.llama_sampler_init_temp(c.temp))
            L.llama_sampler_chain_add(ch, L.llama_sampler_init_dist(c.seed))
        return ch

    def _decode(self, toks: list[int], all_logits: bool = False) -> None:
        """Decode `toks` after what the KV cache holds; logits for the last token, or for every one."""
        L = self.L
        arr = (L.llama_token * len(toks))(*toks)
        batch = L.llama_batch_get_one(arr, len(toks))
        if all_logits:
            out = (ctypes.c_int8 * len(toks))(*([1] * len(toks)))
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

    # -- the run ---------------------------------------------------------------------------------------
    def run(self, text: str | None = None, turn: int = 0) -> Iterator[TokenRow]:
        """Prefill (`text` as sent, default the -p prompt), then decode up to -n tokens, yielding each
        token's row (its `turn` as given); `self.result` holds the summary once the last row has been
        yielded. A second generation needs `clear_memory()` first."""
        cfg, hook = self.cfg, self.hook
        res = RunResult()
        s = res.summary
        s.load_s = self.load_s
        s.extra["load_read_mib"] = round(self.load.read_bytes / MIB, 3) if self.load.read_bytes >= 0 else UNMEASURED
        s.extra["load_populate"] = int(self.load.mode.populate)
        prompt = self.tokenize(self.prompt_text() if text is None else text)
        res.prompt_tokens = prompt
        if len(prompt) + cfg.n_predict > cfg.ctx:
            raise UserError(f"prompt ({len(prompt)} tokens) + -n {cfg.n_predict} exceeds the context -c {cfg.ctx}; "
                            "raise -c or lower -n")
        smpl = self._sampler()
        L = self.L
        # no cyclic garbage collection while generating: the hook allocates per node and per read, and a
        # full collection (over every object the load created) cost ~10% of the CPU of a decode; the
        # generation's few cycles are collected after it
        gc_on = gc.isenabled()
        gc.freeze()
        gc.disable()
        try:
            t0 = time.perf_counter()
            if hook:
                hook.phase = 0
            io_p = sysstats.proc_io_read_bytes()
            self._decode(prompt)
            s.prefill_s = time.perf_counter() - t0
            io_q = sysstats.proc_io_read_bytes()
            s.extra["prefill_io_read_mib"] = round((io_q - io_p) / MIB, 3) if io_p >= 0 and io_q >= 0 else UNMEASURED
            s.n_prompt = len(prompt)
            if hook:
                c = hook.take_counters()
                s.extra["prefill_read_mib"] = round(c.read_bytes / MIB, 3)
                hook.phase = 1

            def first() -> None:
                s.ttft_s = time.perf_counter() - t0

            loop = TokenLoop(self, smpl, s, n_predict=cfg.n_predict, turn=turn, history=prompt,
                             psi_path=self.psi_path, on_first=first)
            yield from loop.rows()
            res.tokens = loop.tokens
            res.eog = loop.finish == "stop"
        finally:
            L.llama_sampler_free(smpl)
            if gc_on:
                gc.enable()
        if hook:
            res.k_effective = hook.k_effective
            s.extra["k_effective"] = hook.k_effective
        self.result = res

    def _row(self, step: int, wall_s: float, loop_ms: float, tok: int, turn: int = 0,
             counters: TokenCounters | None = None) -> TokenRow:
        """A token's row; the hook's counters are `counters` when given (a verify batch's share), else taken."""
        cfg, hook = self.cfg, self.hook
        cache = hook.cache if hook else None
        r = TokenRow(step=step, steps=cfg.n_predict, wall_ms=wall_s * 1e3, turn=turn, loop_overhead_ms=loop_ms,
                     token_id=tok)
        if hook and cache is not None:
            c = counters if counters is not None else hook.take_counters()
            r.stall_ms, r.mgmt_ms, r.mgmt_cpu_ms = c.stall_ns / 1e6, c.mgmt_ns / 1e6, c.mgmt_cpu_ns / 1e6
            r.mgmt_hidden_ms, r.mgmt_bg_cpu_ms = c.mgmt_hidden_ns / 1e6, c.mgmt_bg_cpu_ns / 1e6
            r.io_ms = c.io_ns / 1e6
            r.compute_ms = wall_s * 1e3 - r.stall_ms - r.mgmt_ms
            r.read_bytes = c.read_bytes
            r.cache_hit_pct = cache.stats.hit_pct if cache.enabled else UNMEASURED
            r.cache_budget_mib = cache.budget / MIB
            r.prefetch_bytes, r.prefetch_used_bytes = c.prefetch_bytes, c.prefetch_used_bytes
            r.prefetch_wasted_bytes = c.prefetch_wasted_bytes
        if self.dense is not None:
            r.dense_resident_frac = self.dense.resident_frac(step)
        if hook and hook.route_ahead is not None:
            agree = hook.route_ahead.take_agreement()
            r.route_agree = UNMEASURED if agree is None else round(agree, 6)
        ps, mi = sysstats.proc_status(), sysstats.meminfo()
        r.rss_mib, r.rss_anon_mib, r.rss_file_mib, r.swap_mib = ps["VmRSS"], ps["RssAnon"], ps["RssFile"], ps["VmSwap"]
        r.mem_available_mib, r.mem_free_mib, r.swap_free_mib = mi["MemAvailable"], mi["MemFree"], mi["SwapFree"]
        return r
