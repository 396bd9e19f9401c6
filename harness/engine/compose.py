"""The engine's composition root: from a validated config to a wired run.

It decides the expert source (resident: the plain mmap run, no hook; streamed: cache, reader lanes and the
hook; replayed: the hook forces a recorded routing, streamed or not) and attaches the telemetry sinks (metrics CSV,
route trace, I/O and compute traces, stdout text or progress lines). The CLI only parses, calls `open_engine`, and
prints; the session does only llama.cpp.

The wiring order, declared here only (docs/architecture.md draws it):

1. the checks that need only the file's header (the layout, the config against it, the context) and the cache
   plan, so that a refusal comes before the slow load; `Parts` holds the dense weights and the plan;
2. the model loaded into llama.cpp with no context (`LoadedModel`, harness.engine.run.llama_model); its load
   time and reads are measured alone;
3. the streaming parts built into `Parts` (`_stream_parts`): the dense weights' sweep or anonymous copies (after
   the load, so that they are not the load's reads), then the expert cache, the reader and its lanes, the page
   pool, prefetch, drop, replay and route-ahead, and the hook over them. `Parts` alone owns them (it closes them);
4. the `Session` made over the loaded model and handed `Parts`: its llama.cpp context with `parts.hook` as the
   eval callback, fixed per context, so the hook exists before the context and after the model;
5. the `Engine` over the session (its `parts` are the session's), the cgroup fit checked and the sinks opened.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TextIO

from harness import __version__
from harness.engine.cache.budget import CapFit, ExpertSizes, plan_cache, release_slack
from harness.engine.cache.expert_cache import ExpertCache
from harness.engine.config import EngineConfig, validate_for_model
from harness.engine.guess.mtp import refusal as mtp_refusal
from harness.engine.io import sysstats
from harness.engine.io.dense import DenseWeights, effective_mode, sample_every
from harness.engine.io.reader import ExpertReader, SliceReader
from harness.engine.io.release import BATCH_LAYERS
from harness.engine.io.tracing import Tracing
from harness.engine.model.gguf_layout import ModelLayout, load_layout
from harness.engine.run.context_fit import check_context
from harness.engine.run.engine import Engine, Parts
from harness.engine.run.llama_model import LoadedModel
from harness.engine.run.paths import check_input_files, check_model_file, check_output_paths
from harness.engine.run.session import Session
from harness.engine.run.sinks import CsvSink, RouteTraceSink, TextSink, TraceSink, guarded
from harness.engine.stream.hook import StreamHook
from harness.errors import UserError
from harness.formats.metrics_csv import MetricsWriter
from harness.formats.route_trace import RouteTraceWriter

MIB = 1048576

# installed by the CLI for tests only (harness.engine.io.faults): wraps the reader the hook reads through
ReaderWrapper = Callable[[SliceReader, ModelLayout], ExpertReader]


def _stream_parts(cfg: EngineConfig, layout: ModelLayout, k: int, parts: Parts, *, use_c_filter: bool,
                  wrap_reader: ReaderWrapper | None) -> StreamHook | None:
    """Step 3 of the wiring order, once the model is loaded and before the session: the expert source, the hook (with
    cache and reader when streamed, with the replay when routing is replayed, with the dense weights' anonymous
    copies under `--dense-weights anon`), or None for the resident run. Fills `parts` as it goes, so that whatever
    was built is closed even if a later step fails."""
    assert parts.dense is not None
    parts.dense.after_load()  # warm: the sweep; anon: the reads into anonymous memory
    anon = parts.dense.anon
    replay = None
    if cfg.route_replay:
        from harness.engine.routing.route_replay import RouteReplay

        replay = RouteReplay(cfg.route_replay, layout, k)
    reader = None  # the SliceReader itself, before any test wrapper (wrap_reader)
    if cfg.moe_stream:
        assert parts.plan is not None
        parts.cache = ExpertCache(parts.plan.budget_bytes, layout.expert_bytes_per_layer(), cfg.cache_policy,
                                  n_expert=layout.n_expert)
        reader = SliceReader(layout.shards, cfg.io_threads, cfg.odirect, spec_max=cfg.prefetch_lanes or None)
        parts.reader = wrap_reader(reader, layout) if wrap_reader else reader
    pool = None
    if cfg.moe_stream:  # within the budget and the release slack (_check_cap's)
        from harness.engine.io.recycle import pool_cap, recycle_kind

        assert reader is not None and parts.plan is not None
        kind, parts.recycle = recycle_kind(cfg.recycle_pages, parts.plan.budget_bytes)
        try:
            if kind != "off":
                pool = reader.recycle(kind, pool_cap(kind, parts.plan.budget_bytes,
                                                     release_slack(BATCH_LAYERS, k, layout.expert_bytes_per_layer())))
        except OSError as e:
            if cfg.recycle_pages != "auto":
                raise UserError(f"--recycle-pages {cfg.recycle_pages}: {e.strerror or e}") from None
            parts.recycle = f"off (auto: {kind} is not available here: {e.strerror or e})"
    prefetch = None
    if cfg.moe_stream and (cfg.prefetch or cfg.predict_prefetch):
        from harness.engine.cache.prefetch import make_prefetcher

        assert parts.cache is not None and parts.reader is not None
        prefetch = make_prefetcher(cfg.prefetch, cfg.predict_prefetch, cfg.predict_spec_max, layout, k, parts.cache,
                                   parts.reader, min_recall=cfg.predict_min_recall)
    drop = drop_replay = None
    if cfg.drop_cold_experts is not None or cfg.drop_replay:
        from harness.engine.routing.cold_drop import DropReplay, DropRule

        drop = DropRule(cfg.drop_cold_experts or 0.0, renorm=not cfg.drop_no_renorm, in_prefill=cfg.drop_in_prefill)
        if cfg.drop_replay:
            drop_replay = DropReplay(cfg.drop_replay, layout.n_layer, layout.n_expert, k)
    ahead = None
    if cfg.route_ahead:
        from harness.engine.routing.early_router import EarlyRouter
        from harness.engine.routing.route_ahead import RouteAhead

        ahead = RouteAhead(EarlyRouter.load(layout, k), cfg.route_ahead, layout.moe_layers,
                           lambda il: cfg.n_expert_used or layout.expert_used_by_layer[il])
    if not cfg.moe_stream and replay is None and anon is None and drop_replay is None and ahead is None:
        return None
    tracing = None
    if cfg.io_trace or cfg.compute_trace:
        tracing = Tracing(io=bool(cfg.io_trace), compute=bool(cfg.compute_trace))
        if reader is not None:
            reader.recorder = tracing.io
    parts.hook = StreamHook(layout, parts.cache, parts.reader, record_routes=bool(cfg.route_trace),
                            preload=cfg.cache_preload, use_c_filter=use_c_filter, replay=replay, dense=anon,
                            drop=drop, drop_replay=drop_replay, prefetch=prefetch, tracing=tracing,
                            route_ahead=ahead, evict_thread=cfg.evict_thread, pool=pool)
    if prefetch is not None:
        prefetch.trace = tracing.io if tracing is not None else None
        if prefetch.router is not None:
            parts.hook.taps.append(prefetch.tap)
    return parts.hook


def _check_cap(eng: Engine) -> None:
    """A fixed cache under a memory cgroup limit: the dense weights, the budget and the runtime footprint measured
    now (after the load, before the first token fills the cache) must fit, else one line naming the largest budget
    that does (with --force-cache: a warning, and the run goes on)."""
    plan, dense, hook = eng.parts.plan, eng.parts.dense, eng.parts.hook
    if plan is None or plan.mode != "fixed" or not plan.budget_bytes:
        return
    limit, _use = sysstats.cgroup_memory()
    anon = int(sysstats.proc_status()["RssAnon"] * MIB)
    if limit is None or anon < 0:
        return  # no limit, or no /proc/self/status to measure with
    lay = eng.layout
    # anonymous dense copies cannot be reclaimed; dense weights in the page cache (mmap, warm) can, at the cost of
    # the cliff (major faults every token), not of an OOM kill, so they are not counted
    dense_anon = min(lay.nonexpert_bytes, anon) if dense is not None and dense.mode == "anon" else 0
    # evicted pages wait for the releaser thread (harness.engine.io.release): its open batch holds up to `every`
    # layers' evictions, a decode layer's at most k experts (a prompt's bursts can hold more: budget.CapFit)
    rel = hook.releases.releaser if hook is not None else None
    release = release_slack(rel.every, eng.k, lay.expert_bytes_per_layer()) if rel is not None else 0
    # a prompt's batch can route to every expert of a layer, all resident while that layer runs
    layer = max(lay.expert_bytes_per_layer(), default=0) * lay.n_expert
    fit = CapFit(limit, dense_anon, plan.budget_bytes, anon - dense_anon,
                 getattr(eng.session, "compute_buffer_bytes", None) or 0, release, layer)
    problem = fit.problem(eng.cfg.force_cache)
    if problem and not eng.cfg.force_cache:
        raise UserError(problem)
    if problem:
        eng.load_warnings.append(problem)


def _trace_sink(eng: Engine, tracing: Tracing) -> TraceSink:
    from harness.engine.io.tracing import PERTURBS_COMPUTE, PERTURBS_IO
    from harness.formats.traces import COMPUTE_FORMAT, IO_FORMAT, TraceWriter

    cfg, p = eng.cfg, eng.parts
    common = {"engine_version": __version__, "model_file": os.path.abspath(cfg.model), "arch": eng.layout.arch,
              "n_layer": eng.layout.n_layer, "n_expert": eng.layout.n_expert, "n_expert_used": eng.k}
    io = compute = None
    try:
        if cfg.io_trace:
            io = guarded("--io-trace", cfg.io_trace, lambda: TraceWriter(cfg.io_trace, IO_FORMAT, {
                **common, "io_threads": cfg.io_threads, "odirect_effective": int(bool(p.reader and p.reader.odirect)),
                "perturbs": PERTURBS_IO}))
        if cfg.compute_trace:
            compute = guarded("--compute-trace", cfg.compute_trace, lambda: TraceWriter(
                cfg.compute_trace, COMPUTE_FORMAT, {**common, "threads": cfg.threads,
                                                    "hook_front": p.hook.front if p.hook else "",
                                                    "perturbs": PERTURBS_COMPUTE}))
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
    check_input_files(cfg)
    check_output_paths(cfg)
    layout = load_layout(cfg.model)
    check_context(cfg, layout)
    validate_for_model(cfg, layout.n_expert, layout.n_expert_used)
    if cfg.mtp and (why := mtp_refusal(cfg.model, layout.arch, layout.n_layer_nextn)):
        raise UserError(why)
    if cfg.n_expert_used and layout.expert_used_is_array:
        raise UserError(f"--n-expert-used: {cfg.model} gives expert_used_count per layer, which llama.cpp's "
                        "key override cannot change; drop --n-expert-used")
    if cfg.route_ahead:
        from harness.engine.routing.early_router import NOT_MODELLED

        if layout.arch in NOT_MODELLED:
            raise UserError(f"--route-ahead: {cfg.model} is {layout.arch}: {NOT_MODELLED[layout.arch]}; "
                            "drop --route-ahead")
    k = cfg.n_expert_used or layout.n_expert_used  # 1. the checks above, the plan below: before the slow load
    parts = Parts(dense=DenseWeights(effective_mode(cfg.dense_weights, cfg.moe_stream), layout, odirect=cfg.odirect,
                                     lanes=cfg.io_threads, sample_every=sample_every(layout), wrap_reader=wrap_reader))
    if cfg.moe_stream:
        mem = sysstats.memory_reading() if cfg.cache_mb is None else None
        parts.plan = plan_cache(cfg.budget_ask(), ExpertSizes.of(layout), k, mem)
        if cfg.drop_cold_experts is not None and not parts.plan.budget_bytes:
            raise UserError(f"--drop-cold-experts skips cache misses only, and the cache plan is none "
                            f"({parts.plan.note}); give a --cache-mb of at least one token cycle")
        if (cfg.prefetch or cfg.predict_prefetch) and not parts.plan.budget_bytes:
            raise UserError(f"{'--prefetch' if cfg.prefetch else '--predict-prefetch'} reads ahead into the expert "
                            f"cache, and the cache plan is none "
                            f"({parts.plan.note}); give a --cache-mb of at least one token cycle")
        if cfg.recycle_pages not in ("off", "auto") and not parts.plan.budget_bytes:
            raise UserError(f"--recycle-pages gives an evicted expert's pages to the next miss, and the cache plan is "
                            f"none ({parts.plan.note}); without a cache the pages are reused already (shared slots): "
                            "drop --recycle-pages or give a --cache-mb")
        if cfg.prefetch >= len(layout.by_layer):
            raise UserError(f"--prefetch {cfg.prefetch}: {cfg.model} has {len(layout.by_layer)} MoE layers; "
                            f"give at most {len(layout.by_layer) - 1}")
    loaded = None
    try:
        loaded = LoadedModel(cfg, layout)  # 2. the model, no context
        _stream_parts(cfg, layout, k, parts, use_c_filter=use_c_filter, wrap_reader=wrap_reader)  # 3. the parts
        session = Session(loaded, parts)  # 4. the context, parts.hook its eval callback (closes `loaded` if it fails)
    except BaseException:
        if loaded is not None:
            loaded.close()
        parts.close()
        raise
    eng = Engine(cfg, layout, k, session)  # 5.
    try:
        _check_cap(eng)
        _open_sinks(eng, out)
    except BaseException:
        eng.close()
        raise
    return eng


def _open_sinks(eng: Engine, out: TextIO) -> None:
    """The telemetry sinks, each guarded: an output that cannot be created or written (a read-only folder, a full
    disk, /dev/full) is one line naming its flag and path, now or at the token that fails."""
    cfg, layout, parts, k = eng.cfg, eng.layout, eng.parts, eng.k
    if cfg.csv:
        eng.sinks.append(CsvSink(guarded("--csv", cfg.csv, lambda: MetricsWriter(cfg.csv, eng.preamble()))))
    if cfg.route_trace and parts.hook:
        eng.sinks.append(RouteTraceSink(guarded("--route-trace", cfg.route_trace, lambda: RouteTraceWriter(
            cfg.route_trace, cfg.model, layout.arch, layout.n_layer, layout.n_expert, k,
            layout.expert_bytes_per_layer(), layout.dense_bytes_by_layer)), parts.hook))
    if parts.hook and parts.hook.tracing:
        eng.sinks.append(_trace_sink(eng, parts.hook.tracing))
    eng.sinks.append(TextSink(out, cfg.progress))
