"""One engine run: load the model through llama.cpp's public API, optionally install the streaming
hook, prefill, decode token by token, and emit telemetry. No flag parsing here (config.py), no printing
of results (cli.py)."""

from __future__ import annotations

import ctypes
import os
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from harness import __version__
from harness.engine import sysstats
from harness.engine.cache import ExpertCache, budget_problem, token_cycle_bytes
from harness.engine.config import EngineConfig
from harness.engine.gguf_layout import ModelLayout
from harness.engine.hook import StreamHook
from harness.engine.reader import SliceReader
from harness.errors import UserError
from harness.formats.metrics_csv import UNMEASURED, MetricsWriter, Summary, TokenRow
from harness.formats.route_trace import RouteTraceWriter

MIB = 1048576
AUTO_HEADROOM_MIB = 256


class EngineError(RuntimeError):
    """A failure inside the engine (not the user's input)."""


@dataclass
class CachePlan:
    budget_bytes: int
    mode: str  # "off" | "fixed" | "auto"
    cycle_bytes: int
    note: str = ""


def plan_cache(cfg: EngineConfig, layout: ModelLayout, k: int) -> CachePlan:
    """Resolve --cache-mb 0|N|auto into bytes and apply the token-cycle guard (one rule: cache.py)."""
    ebytes = layout.expert_bytes_per_layer()
    cycle = token_cycle_bytes(ebytes, k)
    total = layout.expert_total_bytes
    if cfg.cache_mb == 0:
        return CachePlan(0, "off", cycle, "no expert cache: every routed expert is read every token")
    if cfg.cache_mb is None:
        mi = sysstats.meminfo()
        avail = mi["MemAvailable"] * MIB
        why = f"MemAvailable {mi['MemAvailable']:.0f} MiB"
        lim, _use = sysstats.cgroup_memory()
        if lim is not None:
            anon = sysstats.proc_status()["RssAnon"] * MIB
            cg_avail = lim - anon
            if cg_avail < avail:
                avail, why = cg_avail, f"cgroup limit {lim / MIB:.0f} MiB less {anon / MIB:.0f} MiB anon"
        budget = int(avail - layout.nonexpert_bytes - AUTO_HEADROOM_MIB * MIB)
        parts = [f"auto: {why}, less dense weights {layout.nonexpert_bytes / MIB:.0f} MiB and "
                 f"{AUTO_HEADROOM_MIB} MiB headroom"]
        if cfg.cache_ceil_mb is not None and budget > cfg.cache_ceil_mb * MIB:
            budget = cfg.cache_ceil_mb * MIB
            parts.append(f"capped by --cache-ceil-mb {cfg.cache_ceil_mb}")
        if budget > total:
            budget = total
            parts.append(f"capped at all experts ({total / MIB:.0f} MiB)")
        budget = max(budget, 0)
        plan = CachePlan(budget, "auto", cycle, "; ".join(parts) + f" -> {budget / MIB:.0f} MiB")
        if budget == 0:
            raise UserError(f"--cache-mb auto found no memory for a cache ({plan.note}); pass --cache-mb 0 "
                            "for no cache, or free memory")
    else:
        budget = cfg.cache_mb * MIB
        plan = CachePlan(budget, "fixed", cycle, f"fixed {cfg.cache_mb} MiB")
    if cfg.cache_preload and plan.budget_bytes < total:
        raise UserError(f"--cache-preload needs a budget of every expert, {-(-total // MIB)} MiB; "
                        f"the budget is {plan.budget_bytes // MIB} MiB ({plan.note})")
    problem = budget_problem(plan.budget_bytes, cycle)
    if problem and not cfg.force_cache:
        raise UserError(problem)
    if problem:
        plan.note += " (forced below the token cycle: expect ~0% hits)"
    return plan


@dataclass
class RunResult:
    tokens: list[int] = field(default_factory=list)
    text: str = ""
    summary: Summary = field(default_factory=Summary)
    k_effective: int | None = None
    cache: CachePlan | None = None
    odirect_note: str | None = None


class Session:
    def __init__(self, cfg: EngineConfig, layout: ModelLayout, corrupt: tuple[int, int, int] | None = None,
                 fail_at_layer: int | None = None, use_c_filter: bool = True):
        from llama_cpp import llama_cpp as L

        self.L = L
        self.cfg = cfg
        self.layout = layout
        self._log: deque[str] = deque(maxlen=50)
        self._log_cb = L.llama_log_callback(self._on_log)
        L.llama_log_set(self._log_cb, ctypes.c_void_p(0))
        L.llama_backend_init()
        self.k_model = layout.n_expert_used
        self.k_requested = cfg.n_expert_used or self.k_model
        if cfg.n_expert_used > layout.n_expert:
            raise UserError(f"--n-expert-used {cfg.n_expert_used} is above the model's {layout.n_expert} experts "
                            f"({cfg.model}); use 1..{layout.n_expert}, or 0 for the model's own {self.k_model}")
        self.hook: StreamHook | None = None
        self.reader: SliceReader | None = None
        self.cache: ExpertCache | None = None
        self.cache_plan: CachePlan | None = None
        if cfg.moe_stream:
            self.cache_plan = plan_cache(cfg, layout, self.k_requested)
        t0 = time.perf_counter()
        self._load_model()
        replay = None
        if cfg.route_replay:
            from harness.engine.route_replay import RouteReplay

            replay = RouteReplay(cfg.route_replay, layout, self.k_requested)
        if cfg.moe_stream:
            assert self.cache_plan is not None
            self.cache = ExpertCache(self.cache_plan.budget_bytes, layout.expert_bytes_per_layer(), cfg.cache_policy,
                                     n_expert=layout.n_expert)
            self.reader = SliceReader(layout.shards, cfg.io_threads, cfg.odirect)
        if cfg.moe_stream or replay is not None:
            self.hook = StreamHook(layout, self.cache, self.reader, record_routes=bool(cfg.route_trace),
                                   corrupt=corrupt, fail_at_layer=fail_at_layer, preload=cfg.cache_preload,
                                   use_c_filter=use_c_filter, replay=replay)
        self._make_context()
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
        mp.n_gpu_layers = 0
        self._kv = None
        if self.cfg.n_expert_used:
            arr = (L.llama_model_kv_override * 2)()
            arr[0].tag = L.LLAMA_KV_OVERRIDE_TYPE_INT
            arr[0].key = f"{self.layout.arch}.expert_used_count".encode()
            arr[0].value.val_i64 = self.cfg.n_expert_used
            arr[1].key = b""
            self._kv = arr  # must stay alive during load
            mp.kv_overrides = ctypes.cast(arr, ctypes.POINTER(L.llama_model_kv_override))
        self.model = L.llama_model_load_from_file(str(self.layout.shards[0]).encode(), mp)
        if not self.model:
            raise EngineError(f"llama.cpp could not load {self.cfg.model}: {self.last_log()}")
        self.vocab = L.llama_model_get_vocab(self.model)

    def _make_context(self) -> None:
        L = self.L
        cp = L.llama_context_default_params()
        cp.n_ctx = self.cfg.ctx
        cp.n_batch = self.cfg.ctx
        cp.n_ubatch = self.cfg.ctx
        cp.n_seq_max = 1
        if self.cfg.threads:
            cp.n_threads = self.cfg.threads
            cp.n_threads_batch = self.cfg.threads
        if self.hook is not None:
            cp.cb_eval = self.hook.cfunc
            cp.cb_eval_user_data = self.hook.user_data
        self.ctx = L.llama_init_from_model(self.model, cp)
        if not self.ctx:
            raise EngineError(f"llama.cpp could not create a context: {self.last_log()}")

    def close(self) -> None:
        L = self.L
        if getattr(self, "ctx", None):
            L.llama_free(self.ctx)
            self.ctx = None
        if getattr(self, "model", None):
            L.llama_model_free(self.model)
            self.model = None
        if self.hook:
            self.hook.close()
        if self.reader:
            self.reader.close()

    # -- text ----------------------------------------------------------------------------------------
    def prompt_text(self) -> str:
        if not self.cfg.chatml:
            return self.cfg.prompt
        L = self.L
        tmpl = L.llama_model_chat_template(self.model, None)
        if not tmpl:
            raise UserError(f"{self.cfg.model} has no chat template (tokenizer.chat_template); drop --chatml")
        msgs = (L.llama_chat_message * 1)()
        msgs[0].role = b"user"
        msgs[0].content = self.cfg.prompt.encode()
        n = 4 * len(self.cfg.prompt) + 1024
        buf = ctypes.create_string_buffer(n)
        got = L.llama_chat_apply_template(tmpl, msgs, 1, True, buf, n)
        if got < 0:
            raise UserError(f"{self.cfg.model}: llama.cpp cannot apply this model's chat template; drop --chatml")
        if got > n:
            buf = ctypes.create_string_buffer(got + 1)
            got = L.llama_chat_apply_template(tmpl, msgs, 1, True, buf, got + 1)
        return buf.raw[:got].decode("utf-8", "replace")

    def tokenize(self, text: str) -> list[int]:
        L = self.L
        raw = text.encode()
        n_max = len(raw) + 16
        arr = (L.llama_token * n_max)()
        n = L.llama_tokenize(self.vocab, raw, len(raw), arr, n_max, True, True)
        if n < 0:
            raise EngineError("tokenization failed")
        return list(arr[:n])

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

    def _decode(self, toks: list[int]) -> None:
        L = self.L
        arr = (L.llama_token * len(toks))(*toks)
        rc = L.llama_decode(self.ctx, L.llama_batch_get_one(arr, len(toks)))
        if self.hook is not None:
            self.hook.raise_if_failed()
        if rc != 0:
            raise EngineError(f"llama_decode returned {rc}: {self.last_log()}")

    # -- the run ---------------------------------------------------------------------------------------
    def preamble(self) -> dict[str, object]:
        lay = self.layout
        p: dict[str, object] = {
            "engine": "bmoe", "engine_version": __version__, "host": sysstats.host_description(),
            "arch": lay.arch, "model_file": os.path.abspath(self.cfg.model), "model_bytes": lay.file_bytes,
            "n_layer": lay.n_layer, "n_expert": lay.n_expert, "n_expert_used_model": self.k_model,
            "expert_bytes_total": lay.expert_total_bytes, "dense_bytes": lay.nonexpert_bytes,
            "mode": "stream" if self.cfg.moe_stream else "mmap",
        }
        p.update({f"cfg.{k}": v for k, v in self.cfg.resolved().items()})
        if self.cache_plan:
            p.update({"cache_budget_bytes": self.cache_plan.budget_bytes, "cache_mode": self.cache_plan.mode,
                      "cache_policy_active": self.cache.policy.name if self.cache else "",
                      "cache_plan": self.cache_plan.note, "token_cycle_bytes": self.cache_plan.cycle_bytes})
        if self.reader:
            p["odirect_effective"] = int(self.reader.odirect)
        if self.hook:
            p["hook_front"] = self.hook.front
        if self.cfg.route_replay:
            p["route_replay"] = os.path.abspath(self.cfg.route_replay)
            p["output_text"] = "meaningless: routing replayed from a recorded trace (timings and bytes are the point)"
        p["read_bytes_source"] = "reader" if self.cfg.moe_stream else "proc_io"
        p["compute_ms_is"] = "residual: wall - stall - mgmt (ggml compute + hook overhead)"
        p["units"] = "ms, bytes, MiB; -1 = unmeasured"
        return p

    def run(self, on_token: Callable[[TokenRow, str], None] | None = None, csv: MetricsWriter | None = None,
            trace: RouteTraceWriter | None = None) -> RunResult:
        cfg, hook = self.cfg, self.hook
        res = RunResult()
        s = res.summary
        s.load_s = self.load_s
        prompt = self.tokenize(self.prompt_text())
        if len(prompt) + cfg.n_predict > cfg.ctx:
            raise UserError(f"prompt ({len(prompt)} tokens) + -n {cfg.n_predict} exceeds the context -c {cfg.ctx}; "
                            "raise -c or lower -n")
        smpl = self._sampler()
        L = self.L
        try:
            t0 = time.perf_counter()
            if hook:
                hook.phase = 0
            self._decode(prompt)
            s.prefill_s = time.perf_counter() - t0
            s.n_prompt = len(prompt)
            if hook:
                c = hook.take_counters()
                s.extra["prefill_read_mib"] = round(c.read_bytes / MIB, 3)
                if trace:
                    trace.events(0, 0, hook.routes)
                    hook.routes.clear()
                hook.phase = 1
            majflt0, cpu0 = sysstats.rusage()
            io0 = sysstats.proc_io_read_bytes()
            out = bytearray()
            tok = L.llama_sampler_sample(smpl, self.ctx, -1)
            s.ttft_s = time.perf_counter() - t0
            t_loop = time.perf_counter()
            for step in range(1, cfg.n_predict + 1):
                if L.llama_vocab_is_eog(self.vocab, tok):
                    break
                res.tokens.append(tok)
                delta = self.piece(tok)
                out += delta
                loop_ms = (time.perf_counter() - t_loop) * 1e3
                t1 = time.perf_counter()
                self._decode([tok])
                wall = time.perf_counter() - t1
                t_loop = time.perf_counter()
                s.decode_s += wall
                s.n_decode += 1
                row = self._row(step, wall, loop_ms, tok)
                majflt, cpu = sysstats.rusage()
                row.majflt = majflt - majflt0
                row.majflt_mib = round((majflt - majflt0) * 4096 / MIB, 3)
                row.cpu_ms = (cpu - cpu0) * 1e3
                majflt0, cpu0 = majflt, cpu
                if self.cache is None:
                    io = sysstats.proc_io_read_bytes()
                    row.read_bytes = io - io0 if io >= 0 and io0 >= 0 else UNMEASURED
                    io0 = io
                    if row.read_bytes != UNMEASURED:
                        s.read_bytes += row.read_bytes
                else:
                    s.read_bytes += row.read_bytes
                    if trace:
                        trace.events(0, step, hook.routes)
                        hook.routes.clear()
                if csv:
                    csv.row(row)
                if on_token:
                    on_token(row, delta.decode("utf-8", "replace"))
                tok = L.llama_sampler_sample(smpl, self.ctx, -1)
        finally:
            L.llama_sampler_free(smpl)
        res.text = out.decode("utf-8", "replace")
        if hook:
            res.k_effective = hook.k_effective
            s.extra["k_effective"] = hook.k_effective
        if hook and self.cache:
            st = self.cache.stats
            s.hit_pct = st.hit_pct if self.cache.enabled else None
            s.cache_resident_mib = self.cache.resident_bytes / MIB if self.cache.enabled else None
            s.evictions = st.evictions if self.cache.enabled else None
            s.extra["cache_budget_mib"] = round(self.cache.budget / MIB, 3)
            s.extra["token_cycle_mib"] = round(self.cache_plan.cycle_bytes / MIB, 3) if self.cache_plan else -1
            s.extra["odirect"] = int(self.reader.odirect) if self.reader else 0
        s.extra["peak_rss_mib"] = round(sysstats.proc_status()["VmHWM"], 1)
        res.cache = self.cache_plan
        if self.reader and self.reader.odirect_refused:
            res.odirect_note = self.reader.odirect_refused
        return res

    def _row(self, step: int, wall_s: float, loop_ms: float, tok: int) -> TokenRow:
        cfg, hook = self.cfg, self.hook
        r = TokenRow(step=step, steps=cfg.n_predict, wall_ms=wall_s * 1e3, turn=0, loop_overhead_ms=loop_ms,
                     token_id=tok)
        if hook and self.cache is not None:
            c = hook.take_counters()
            r.stall_ms, r.mgmt_ms = c.stall_ns / 1e6, c.mgmt_ns / 1e6
            r.io_ms = c.io_ns / 1e6
            r.compute_ms = wall_s * 1e3 - r.stall_ms - r.mgmt_ms
            r.read_bytes = c.read_bytes
            r.cache_hit_pct = self.cache.stats.hit_pct if self.cache.enabled else UNMEASURED
            r.cache_budget_mib = self.cache.budget / MIB
        ps, mi = sysstats.proc_status(), sysstats.meminfo()
        r.rss_mib, r.rss_anon_mib, r.rss_file_mib, r.swap_mib = ps["VmRSS"], ps["RssAnon"], ps["RssFile"], ps["VmSwap"]
        r.mem_available_mib, r.mem_free_mib, r.swap_free_mib = mi["MemAvailable"], mi["MemFree"], mi["SwapFree"]
        return r
