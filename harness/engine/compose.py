"""The engine's composition root: from a validated config to a wired run.

It decides the expert source (resident: the plain mmap run, no hook; streamed: cache, reader lanes and the
hook; replayed: the hook forces a recorded routing, streamed or not), plans the cache budget before the
model loads, builds the parts in order, and attaches the telemetry sinks (metrics CSV, route trace, stdout
text or progress lines). The session does only llama.cpp and the token loop; the CLI only parses, calls
`open_engine`, and prints.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TextIO

from harness import __version__
from harness.engine import sysstats
from harness.engine.cache import ExpertCache
from harness.engine.cache_plan import CachePlan, ExpertSizes, plan_cache
from harness.engine.config import EngineConfig, lossy_settings, validate_for_model
from harness.engine.dense import DenseWeights, effective_mode, sample_every
from harness.engine.exactness import batch_inexact_reason, system_info
from harness.engine.gguf_layout import ModelLayout, load_layout
from harness.engine.hook import StreamHook
from harness.engine.mtp import refusal as mtp_refusal
from harness.engine.policies import native as policies_native
from harness.engine.pressure import Pressure
from harness.engine.reader import ExpertReader, SliceReader
from harness.engine.session import RunResult, Session
from harness.engine.sinks import CsvSink, RouteTraceSink, Sink, TextSink, TraceSink
from harness.engine.tracing import Tracing
from harness.errors import UserError
from harness.formats.metrics_csv import MetricsWriter, Summary
from harness.formats.replies import PromptItem, RepliesWriter, Reply
from harness.formats.route_trace import RouteTraceWriter

MIB = 1048576

DENSE_FRAC_IS = {
    "mmap": "mincore over the dense pages of llama.cpp's file mapping (in the page cache = resident)",
    "warm": "mincore over the dense pages of llama.cpp's file mapping (in the page cache = resident)",
    "anon": "mincore over the dense tensors' anonymous copies (1.0 unless swapped out)",
}

# installed by the CLI for tests only (harness.engine.faults): wraps the reader the hook reads through
ReaderWrapper = Callable[[SliceReader, ModelLayout], ExpertReader]


def check_model_file(path: str) -> None:
    if not os.path.exists(path):
        raise UserError(f"{path}: no such model file; check the -m path")
    if os.path.isdir(path):
        raise UserError(f"{path}: is a directory; pass the .gguf file (first shard of a split model)")
    if not os.access(path, os.R_OK):
        raise UserError(f"{path}: permission denied; make the model file readable (chmod a+r)")


@dataclass
class Parts:
    """The streaming parts of a run (all None for the plain mmap run)."""

    plan: CachePlan | None = None
    cache: ExpertCache | None = None
    reader: ExpertReader | None = None
    hook: StreamHook | None = None
    dense: DenseWeights | None = None

    def close(self) -> None:
        if self.hook:
            self.hook.close()
        if self.reader:
            self.reader.close()
        if self.dense:
            self.dense.close()


@dataclass
class Engine:
    cfg: EngineConfig
    layout: ModelLayout
    k: int  # experts per token requested (the override, or the model's own)
    session: Session
    parts: Parts
    sinks: list[Sink] = field(default_factory=list)
    pressure: Pressure | None = None  # the last run's memory-pressure totals

    def notes(self) -> list[str]:
        """What the run is about to do, for stderr."""
        cfg, lay, p = self.cfg, self.layout, self.parts
        out = []
        if cfg.moe_stream and p.plan:
            out.append(f"bmoe: streaming {lay.arch}: {len(lay.by_layer)} MoE layers x {lay.n_expert} experts, "
                       f"k={self.k}, token cycle T={p.plan.cycle_bytes / MIB:.1f} MiB; cache {p.plan.note}; "
                       f"policy {cfg.cache_policy}; {cfg.io_threads} lanes, "
                       f"O_DIRECT {'on' if p.reader and p.reader.odirect else 'off'}")
            if p.reader and p.reader.odirect_refused:
                out.append(f"bmoe: {p.reader.odirect_refused}")
            if lay.facts():
                out.append(f"bmoe: layout: {lay.facts()}")
        note = p.dense.note() if p.dense else None
        if note:
            out.append(note)
        if p.hook and p.hook.front_note:
            out.append(p.hook.front_note)
        if (cfg.ngram or cfg.mtp) and (why := batch_inexact_reason(system_info(), cfg.flash_attn)):
            out.append(f"bmoe: {'--mtp' if cfg.mtp else '--ngram'}: {why}")
        if cfg.route_replay:
            out.append(f"bmoe: route replay from {cfg.route_replay}: routing follows the trace, so the output "
                       "text is meaningless; timings and bytes are the point")
        return out

    def run(self, between_tokens: Callable[[], None] = lambda: None) -> RunResult:
        """Generate, feeding every sink each token row; `between_tokens` runs before each row is handed out
        (the CLI checks for Ctrl-C there). Returns the result with the complete summary."""
        self.pressure = Pressure()
        return self._generate(None, 0, between_tokens)[0]

    def _generate(self, text: str | None, turn: int, between_tokens: Callable[[], None]) -> tuple[RunResult, bytes]:
        """One generation through every sink: (its result, the generated bytes)."""
        sess = self.session
        assert self.pressure is not None
        rows = sess.run(text, turn)
        out = bytearray()
        try:
            for row in rows:
                between_tokens()
                self.pressure.add(row)
                piece = sess.piece(row.token_id)
                out += piece
                # surrogateescape keeps a piece's raw bytes (a token may end inside a UTF-8 character):
                # the text sink writes them back unchanged, as the C++ engine does
                text_delta = piece.decode("utf-8", "surrogateescape")
                for s in self.sinks:
                    s.row(row, text_delta)
        finally:
            rows.close()  # an interrupted run frees its sampler now, before the session closes
        res = sess.result
        assert res is not None
        self._complete(res.summary)
        for s in self.sinks:
            s.finish(res.summary)
        return res, bytes(out)

    def run_prompts(self, items: list[PromptItem], replies: RepliesWriter | None,
                    between_tokens: Callable[[], None] = lambda: None) -> list[RunResult]:
        """--prompts-file: every prompt in turn in this process, the KV cache cleared between them and
        everything else (model, expert cache, reader lanes) kept; one CSV turn and one reply each."""
        sess, cfg = self.session, self.cfg
        sent = [sess.build(it.prompt) for it in items]
        for it, text in zip(items, sent, strict=True):  # refuse before the first answer, not halfway through
            n = len(sess.tokenize(text))
            if n + cfg.n_predict > cfg.ctx:
                raise UserError(f"{cfg.prompts_file}: prompt {it.id!r} ({n} tokens) + -n {cfg.n_predict} exceeds "
                                f"the context -c {cfg.ctx}; raise -c or lower -n")
        self.pressure = Pressure()
        results = []
        for turn, (it, text) in enumerate(zip(items, sent, strict=True)):
            if turn:
                sess.clear_memory()
            t0 = time.perf_counter()
            res, out = self._generate(text, turn, between_tokens)
            wall = time.perf_counter() - t0
            s = res.summary
            if replies is not None:
                replies.reply(Reply(turn=turn, id=it.id, prompt=text, reply=out.decode("utf-8", "replace"),
                                    n_prompt=s.n_prompt, n_tokens=s.n_decode, stop="eog" if res.eog else "limit",
                                    prefill_ms=round(s.prefill_s * 1e3, 3), decode_ms=round(s.decode_s * 1e3, 3),
                                    time_ms=round(wall * 1e3, 3)))
            results.append(res)
        return results

    def warnings(self) -> list[str]:
        """One-line warnings about the run just made (a reclaim storm), for stderr."""
        p = self.parts
        w = self.pressure.warning(p.dense.mode if p.dense else "mmap", self.cfg.moe_stream) if self.pressure else None
        return [w] if w else []

    def _complete(self, s: Summary) -> None:
        p = self.parts
        if p.hook and p.cache:
            st = p.cache.stats
            s.hit_pct = st.hit_pct if p.cache.enabled else None
            s.cache_resident_mib = p.cache.resident_bytes / MIB if p.cache.enabled else None
            s.evictions = st.evictions if p.cache.enabled else None
            s.extra["cache_budget_mib"] = round(p.cache.budget / MIB, 3)
            s.extra["token_cycle_mib"] = round(p.plan.cycle_bytes / MIB, 3) if p.plan else -1
            s.extra["odirect"] = int(p.reader.odirect) if p.reader else 0
        if p.hook and p.hook.prefetch:
            s.extra.update(p.hook.prefetch.summary())
        if p.dense:
            s.extra.update(p.dense.summary())
        if p.hook and p.hook.drop:
            ds, dd, ps, pd = p.hook.drop_totals
            s.extra.update({"drop_decode_slots": ds, "drop_decode_dropped": dd,
                            "drop_decode_frac": round(dd / ds, 6) if ds else -1, "drop_prefill_slots": ps,
                            "drop_prefill_dropped": pd})
        if p.hook and p.hook.route_ahead is not None:
            agree = p.hook.route_ahead.agreement
            s.extra["route_agree"] = -1 if agree is None else round(agree, 6)
            s.extra["route_ahead_early_reads"] = int(p.hook.early_reads)
        s.extra["peak_rss_mib"] = round(sysstats.proc_status()["VmHWM"], 1)

    def preamble(self) -> dict[str, object]:
        """The metrics CSV's preamble: engine, model, the resolved configuration (`cfg.*`), what was wired."""
        cfg, lay, p = self.cfg, self.layout, self.parts
        d: dict[str, object] = {
            "engine": "bmoe", "engine_version": __version__, "host": sysstats.host_description(),
            "arch": lay.arch, "model_file": os.path.abspath(cfg.model), "model_bytes": lay.file_bytes,
            "n_layer": lay.n_layer, "n_expert": lay.n_expert, "n_expert_used_model": lay.n_expert_used,
            "expert_bytes_total": lay.expert_total_bytes, "dense_bytes": lay.nonexpert_bytes,
            "mode": "stream" if cfg.moe_stream else "mmap",
        }
        d.update({f"cfg.{k}": v for k, v in cfg.resolved().items()})
        if self.session.prompt.no_think:
            d["no_think"] = self.session.prompt.no_think
        d.update(self.session.load.preamble())
        if p.plan:
            d.update({"cache_budget_bytes": p.plan.budget_bytes, "cache_mode": p.plan.mode,
                      "cache_policy_active": p.cache.policy.name if p.cache else "",
                      "cache_policy_impl": policies_native.implementation(),  # compiled, or numpy (the reference)
                      "cache_plan": p.plan.note, "token_cycle_bytes": p.plan.cycle_bytes})
        if p.reader:
            d["odirect_effective"] = int(p.reader.odirect)
            d["io_lanes"] = getattr(getattr(p.reader, "inner", p.reader), "lanes_impl", "python")  # c | python
        if p.hook:
            d["hook_front"] = p.hook.front
        lossy = lossy_settings(cfg)
        if lossy:
            d["lossy"] = "; ".join(lossy)
        if cfg.drop_cold_experts is not None:
            d["reproducible"] = "no: which experts --drop-cold-experts skips depends on the cache state"
        if cfg.route_ahead:
            d["route_agree_is"] = ("share of the routed-ahead slots (decode layers after the first N MoE layers) whose "
                                   "committed expert is among that layer's own router's top-k; -1 = none routed ahead")
            d["route_ahead_reads"] = ("none (resident)" if not cfg.moe_stream else "at commit time, N layers early"
                                      if p.hook and p.hook.early_reads else
                                      "at the layer's own routing node (no cache: the shared slots hold one layer)")
        if cfg.route_replay:
            d["route_replay"] = os.path.abspath(cfg.route_replay)
            d["output_text"] = "meaningless: routing replayed from a recorded trace (timings and bytes are the point)"
        n = p.dense.sample_every if p.dense else 1
        mode = p.dense.mode if p.dense else "mmap"
        d["dense_weights"] = mode
        d["dense_resident_frac_is"] = DENSE_FRAC_IS[mode] + (
            f"; measured every {n} tokens (from the first), -1 in between" if n > 1 else "")
        d["read_bytes_source"] = "reader" if cfg.moe_stream else "proc_io"
        if p.hook and p.hook.prefetch:
            d["prefetch_is"] = ("speculative reads on idle lanes (lossless): read_bytes and io_ms include them; "
                                "prefetch_bytes = their experts' bytes completed, used = hit by a later lookup, "
                                "wasted = evicted unused (the summary adds those unused at the end)")
        d["mem_stall_ms_is"] = self.session.psi_source
        d["compute_ms_is"] = "residual: wall - stall - mgmt (ggml compute + hook overhead)"
        d["units"] = "ms, bytes, MiB; -1 = unmeasured"
        return d

    def close(self) -> None:
        for s in self.sinks:
            s.close()
        self.sinks = []
        self.session.close()
        self.parts.close()


def _stream_parts(cfg: EngineConfig, layout: ModelLayout, k: int, parts: Parts, *, use_c_filter: bool,
                  wrap_reader: ReaderWrapper | None) -> StreamHook | None:
    """Build the expert source once the model is loaded: the hook (with cache and reader when streamed,
    with the replay when routing is replayed, with the dense weights' anonymous copies under
    `--dense-weights anon`), or None for the resident run. Fills `parts` as it goes, so that whatever was
    built is closed even if a later step fails."""
    assert parts.dense is not None
    parts.dense.after_load()  # warm: the sweep; anon: the reads into anonymous memory
    anon = parts.dense.anon
    replay = None
    if cfg.route_replay:
        from harness.engine.route_replay import RouteReplay

        replay = RouteReplay(cfg.route_replay, layout, k)
    if cfg.moe_stream:
        assert parts.plan is not None
        parts.cache = ExpertCache(parts.plan.budget_bytes, layout.expert_bytes_per_layer(), cfg.cache_policy,
                                  n_expert=layout.n_expert)
        reader = SliceReader(layout.shards, cfg.io_threads, cfg.odirect, spec_max=cfg.prefetch_lanes or None)
        parts.reader = wrap_reader(reader, layout) if wrap_reader else reader
    prefetch = None
    if cfg.moe_stream and (cfg.prefetch or cfg.predict_prefetch):
        from harness.engine.prefetch import make_prefetcher

        assert parts.cache is not None and parts.reader is not None
        prefetch = make_prefetcher(cfg.prefetch, cfg.predict_prefetch, cfg.predict_spec_max, layout, k, parts.cache,
                                   parts.reader)
    drop = drop_replay = None
    if cfg.drop_cold_experts is not None or cfg.drop_replay:
        from harness.engine.drop import DropReplay, DropRule

        drop = DropRule(cfg.drop_cold_experts or 0.0, renorm=not cfg.drop_no_renorm, in_prefill=cfg.drop_in_prefill)
        if cfg.drop_replay:
            drop_replay = DropReplay(cfg.drop_replay, layout.n_layer, layout.n_expert, k)
    ahead = None
    if cfg.route_ahead:
        from harness.engine.early_router import EarlyRouter
        from harness.engine.route_ahead import RouteAhead

        ahead = RouteAhead(EarlyRouter.load(layout, k), cfg.route_ahead, layout.moe_layers,
                           lambda il: cfg.n_expert_used or layout.expert_used_by_layer[il])
    if not cfg.moe_stream and replay is None and anon is None and drop_replay is None and ahead is None:
        return None
    tracing = None
    if cfg.io_trace or cfg.compute_trace:
        tracing = Tracing(io=bool(cfg.io_trace), compute=bool(cfg.compute_trace))
        if isinstance(reader := getattr(parts.reader, "inner", parts.reader), SliceReader):
            reader.recorder = tracing.io
    parts.hook = StreamHook(layout, parts.cache, parts.reader, record_routes=bool(cfg.route_trace),
                            preload=cfg.cache_preload, use_c_filter=use_c_filter, replay=replay, dense=anon,
                            drop=drop, drop_replay=drop_replay, prefetch=prefetch, tracing=tracing,
                            route_ahead=ahead, evict_thread=cfg.evict_thread)
    if prefetch is not None:
        prefetch.trace = tracing.io if tracing is not None else None
        if prefetch.router is not None:
            parts.hook.taps.append(prefetch.tap)
    return parts.hook


def _trace_sink(eng: Engine, tracing: Tracing) -> TraceSink:
    from harness.engine.tracing import PERTURBS_COMPUTE, PERTURBS_IO
    from harness.formats.traces import COMPUTE_FORMAT, IO_FORMAT, TraceWriter

    cfg, p = eng.cfg, eng.parts
    common = {"engine_version": __version__, "model_file": os.path.abspath(cfg.model), "arch": eng.layout.arch,
              "n_layer": eng.layout.n_layer, "n_expert": eng.layout.n_expert, "n_expert_used": eng.k}
    io = compute = None
    try:
        if cfg.io_trace:
            io = TraceWriter(cfg.io_trace, IO_FORMAT, {
                **common, "io_threads": cfg.io_threads, "odirect_effective": int(bool(p.reader and p.reader.odirect)),
                "perturbs": PERTURBS_IO})
        if cfg.compute_trace:
            compute = TraceWriter(cfg.compute_trace, COMPUTE_FORMAT, {
                **common, "threads": cfg.threads, "hook_front": p.hook.front if p.hook else "",
                "perturbs": PERTURBS_COMPUTE})
    except BaseException:
        for w in (io, compute):
            if w is not None:
                w.close()
        raise
    return TraceSink(tracing, io, compute)


def open_engine(cfg: EngineConfig, out: TextIO, *, use_c_filter: bool = True,
                wrap_reader: ReaderWrapper | None = None) -> Engine:
    """Check the model, plan the cache (refusals come before the slow load), load, wire, open the sinks.
    `out` receives the generated text (or the progress lines)."""
    check_model_file(cfg.model)
    layout = load_layout(cfg.model)
    validate_for_model(cfg, layout.n_expert, layout.n_expert_used)
    if cfg.mtp and (why := mtp_refusal(cfg.model, layout.arch, layout.n_layer_nextn)):
        raise UserError(why)
    if cfg.n_expert_used and layout.expert_used_is_array:
        raise UserError(f"--n-expert-used: {cfg.model} gives expert_used_count per layer, which llama.cpp's "
                        "key override cannot change; drop --n-expert-used")
    if cfg.route_ahead:
        from harness.engine.early_router import NOT_MODELLED

        if layout.arch in NOT_MODELLED:
            raise UserError(f"--route-ahead: {cfg.model} is {layout.arch}: {NOT_MODELLED[layout.arch]}; "
                            "drop --route-ahead")
    k = cfg.n_expert_used or layout.n_expert_used
    parts = Parts(dense=DenseWeights(effective_mode(cfg.dense_weights, cfg.moe_stream), layout, odirect=cfg.odirect,
                                     lanes=cfg.io_threads, sample_every=sample_every(layout), wrap_reader=wrap_reader))
    if cfg.moe_stream:
        mem = sysstats.memory_reading() if cfg.cache_mb is None else None
        parts.plan = plan_cache(cfg, ExpertSizes.of(layout), k, mem)
        if cfg.drop_cold_experts is not None and not parts.plan.budget_bytes:
            raise UserError(f"--drop-cold-experts skips cache misses only, and the cache plan is none "
                            f"({parts.plan.note}); give a --cache-mb of at least one token cycle")
        if (cfg.prefetch or cfg.predict_prefetch) and not parts.plan.budget_bytes:
            raise UserError(f"{'--prefetch' if cfg.prefetch else '--predict-prefetch'} reads ahead into the expert "
                            f"cache, and the cache plan is none "
                            f"({parts.plan.note}); give a --cache-mb of at least one token cycle")
        if cfg.prefetch >= len(layout.by_layer):
            raise UserError(f"--prefetch {cfg.prefetch}: {cfg.model} has {len(layout.by_layer)} MoE layers; "
                            f"give at most {len(layout.by_layer) - 1}")
    try:
        session = Session(cfg, layout, lambda: _stream_parts(cfg, layout, k, parts, use_c_filter=use_c_filter,
                                                             wrap_reader=wrap_reader), dense=parts.dense)
    except BaseException:
        parts.close()
        raise
    eng = Engine(cfg, layout, k, session, parts)
    try:
        if cfg.csv:
            eng.sinks.append(CsvSink(MetricsWriter(cfg.csv, eng.preamble())))
        if cfg.route_trace and parts.hook:
            eng.sinks.append(RouteTraceSink(
                RouteTraceWriter(cfg.route_trace, cfg.model, layout.arch, layout.n_layer, layout.n_expert, k,
                                 layout.expert_bytes_per_layer(), layout.dense_bytes_by_layer), parts.hook))
        if parts.hook and parts.hook.tracing:
            eng.sinks.append(_trace_sink(eng, parts.hook.tracing))
        eng.sinks.append(TextSink(out, cfg.progress))
    except BaseException:
        eng.close()
        raise
    return eng
