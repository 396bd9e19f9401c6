"""Validation of an EngineConfig: declared ranges and choices, the stream-only rule, the cross-field rules;
`parse_cli`, which parses and validates; the lossy settings a configuration makes."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from harness.engine.config.fields import SPECS, EngineConfig, Spec, build_parser
from harness.errors import UserError


def parse_cli(argv: list[str]) -> EngineConfig:
    """Parse and validate `bmoe` flags. Raises UserError with one line on any problem."""
    cfg = EngineConfig(**vars(build_parser().parse_args(argv)))
    validate(cfg)
    return cfg


# -- validation --------------------------------------------------------------------------------------------


def _range_problem(s: Spec, v: Any) -> str | None:
    lo, hi = s.flag.lo, s.flag.hi
    if (lo is None or v >= lo) and (hi is None or v <= hi):
        return None
    if lo is not None and hi is not None:
        want = f"{lo:g}..{hi:g}"
    elif lo is not None:
        want = f">= {lo:g}"
    else:
        want = f"<= {hi:g}"
    return f"bmoe: {s.label} must be {want}, got {v}"


def _ceil_needs_auto(cfg: EngineConfig) -> str | None:
    if cfg.cache_ceil_mb is not None and cfg.cache_mb is not None:
        return "bmoe: --cache-ceil-mb caps --cache-mb auto; it makes no sense with a fixed --cache-mb"
    return None


def _preload_needs_cache(cfg: EngineConfig) -> str | None:
    if cfg.cache_preload and cfg.cache_mb == 0:
        return "bmoe: --cache-preload needs a cache: drop --cache-mb 0"
    return None


def _no_think_needs_chatml(cfg: EngineConfig) -> str | None:
    if cfg.no_think and not cfg.chatml:
        return "bmoe: --no-think switches reasoning off inside the model's chat template: add --chatml"
    return None


def _prompts_file_rules(cfg: EngineConfig) -> str | None:
    if cfg.replies is not None and cfg.prompts_file is None:
        return "bmoe: --replies records the answers of a --prompts-file run: add --prompts-file PATH"
    if cfg.prompts_file is None:
        return None
    if cfg.temp > 0:
        return "bmoe: --prompts-file runs are greedy (every prompt answered as a fresh greedy run): drop --temp"
    for name, flag in (("route_trace", "--route-trace"), ("route_replay", "--route-replay"),
                       ("io_trace", "--io-trace"), ("compute_trace", "--compute-trace")):
        if getattr(cfg, name) is not None:
            return f"bmoe: {flag} records or replays one generation; it cannot be combined with --prompts-file"
    return None


def _traces_one_generation(cfg: EngineConfig) -> str | None:
    for name, flag in (("io_trace", "--io-trace"), ("compute_trace", "--compute-trace")):
        if getattr(cfg, name) is not None and cfg.session:
            return f"bmoe: {flag} records one generation; it cannot be combined with --session"
    return None


def _drop_rules(cfg: EngineConfig) -> str | None:
    on = cfg.drop_cold_experts is not None
    if on and cfg.drop_replay:
        return "bmoe: --drop-cold-experts decides drops, --drop-replay replays recorded ones: give one of them"
    if on and cfg.cache_mb == 0:
        return "bmoe: --drop-cold-experts skips cache misses only, so it needs a cache: give --cache-mb N or auto"
    if on and cfg.cache_preload:
        return "bmoe: --drop-cold-experts with --cache-preload: every expert is resident, nothing would drop"
    if cfg.drop_in_prefill and not on:
        return "bmoe: --drop-in-prefill needs --drop-cold-experts F"
    if cfg.drop_no_renorm and not on and not cfg.drop_replay:
        return "bmoe: --drop-no-renorm needs --drop-cold-experts F or --drop-replay TRACE"
    return None


def _prefetch_rules(cfg: EngineConfig) -> str | None:
    flag = "--prefetch" if cfg.prefetch > 0 else "--predict-prefetch" if cfg.predict_prefetch else None
    if flag and cfg.cache_mb == 0:
        return (f"bmoe: {flag} reads experts ahead into the expert cache, so it needs one: give --cache-mb N "
                "or auto (with --cache-mb 0 every layer shares one buffer, which a read ahead would overwrite)")
    if flag and cfg.cache_preload:
        return f"bmoe: {flag} with --cache-preload: every expert is resident, there is nothing to read ahead"
    if cfg.predict_min_recall and not cfg.predict_prefetch:
        return "bmoe: --predict-min-recall gates --predict-prefetch's reads per layer: add --predict-prefetch"
    return None


def _route_ahead_rules(cfg: EngineConfig) -> str | None:
    if not cfg.route_ahead:
        return None
    for name, flag in (("route_replay", "--route-replay"), ("route_trace", "--route-trace"),
                       ("drop_cold_experts", "--drop-cold-experts"), ("drop_replay", "--drop-replay")):
        if getattr(cfg, name) is not None:
            return f"bmoe: --route-ahead commits the routing itself; it cannot be combined with {flag}"
    if cfg.prefetch > 0 or cfg.predict_prefetch:
        return ("bmoe: --route-ahead already reads each layer's experts early; combining it with --prefetch or "
                "--predict-prefetch is not supported (not gated): use one of them")
    return None


_DEFAULTS = {s.name: s.default for s in SPECS}  # each field's declared default (fields.py)


def _given(cfg: EngineConfig, name: str) -> bool:
    """The field differs from its declared default (the flag was given a value of its own)."""
    return getattr(cfg, name) != _DEFAULTS[name]


def _guess_rules(cfg: EngineConfig) -> str | None:
    if not cfg.ngram and _given(cfg, "ngram_size"):
        return "bmoe: --ngram-size sets how --ngram guesses: add --ngram"
    if not cfg.ngram and not cfg.mtp:
        if _given(cfg, "draft"):
            return "bmoe: --draft sets how many tokens --ngram or --mtp guesses: add --ngram or --mtp"
        return None
    if cfg.ngram and cfg.mtp:
        return "bmoe: --ngram and --mtp are two ways of guessing ahead: use one of them"
    name = "--ngram" if cfg.ngram else "--mtp"
    if cfg.temp > 0:
        return f"bmoe: {name} verifies its guesses against greedy decoding: drop --temp"
    for attr, flag in (("route_trace", "--route-trace"), ("route_replay", "--route-replay"),
                       ("drop_cold_experts", "--drop-cold-experts"), ("drop_replay", "--drop-replay")):
        if getattr(cfg, attr) is not None:
            return f"bmoe: {flag} works one decoded token at a time; it cannot be combined with {name}"
    for on, flag in ((cfg.prefetch > 0, "--prefetch"), (cfg.predict_prefetch, "--predict-prefetch"),
                     (cfg.route_ahead > 0, "--route-ahead")):
        if on:
            return f"bmoe: {flag} with {name} is not supported (not gated together): use one of them"
    return None


def _fidelity_rules(cfg: EngineConfig) -> str | None:
    if cfg.fidelity_csv is not None and cfg.fidelity_against is None:
        return "bmoe: --fidelity-csv writes the figures of a --fidelity-against run: add --fidelity-against REF"
    for name, flag in (("fidelity_top_k", "--fidelity-top-k"), ("fidelity_chunks", "--fidelity-chunks")):
        if _given(cfg, name) and cfg.fidelity_ref is None:
            return f"bmoe: {flag} sets what a --fidelity-ref file holds: add --fidelity-ref OUT"
    if cfg.fidelity_ref is None and cfg.fidelity_against is None:
        if cfg.fidelity_decode:
            return "bmoe: --fidelity-decode sets how a text is scored: add --fidelity-ref OUT or --fidelity-against REF"
        return None
    if cfg.fidelity_ref is not None and cfg.fidelity_against is not None:
        return ("bmoe: --fidelity-ref writes a reference, --fidelity-against scores against one: give one of them "
                "(score the reference first, then each run against it)")
    name = "--fidelity-ref" if cfg.fidelity_ref is not None else "--fidelity-against"
    for on, flag in ((cfg.prompts_file is not None, "--prompts-file"), (cfg.session, "--session"),
                     (cfg.csv is not None, "--csv"), (cfg.ngram, "--ngram"), (cfg.mtp, "--mtp"),
                     (cfg.io_trace is not None, "--io-trace"), (cfg.compute_trace is not None, "--compute-trace"),
                     (cfg.route_replay is not None, "--route-replay")):
        if on:
            return f"bmoe: {name} scores a fixed text instead of generating; it cannot be combined with {flag}"
    if cfg.fidelity_decode:  # one token at a time: every decode-time knob acts as in generation
        if cfg.drop_in_prefill:
            return (f"bmoe: {name} --fidelity-decode decodes every position as generation does, where "
                    "--drop-cold-experts already drops; --drop-in-prefill would add drops at each chunk's first "
                    "token only: drop it")
        return None
    if cfg.route_ahead:
        return (f"bmoe: {name} scores every position in a prompt batch, where --route-ahead changes nothing "
                "(it acts while decoding one token at a time): add --fidelity-decode or drop it")
    if cfg.drop_cold_experts is not None and not cfg.drop_in_prefill:
        return (f"bmoe: {name} scores every position in a prompt batch, where --drop-cold-experts drops nothing "
                "unless told to: add --fidelity-decode (one token at a time, as generation) or --drop-in-prefill")
    return None


def lossy_settings(cfg: EngineConfig) -> list[str]:
    """The lossy knobs this configuration sets ("--flag: why"), for the CSV preamble."""
    return [f"{s.label}: {s.flag.lossy}" for s in SPECS if s.flag.lossy and getattr(cfg, s.name) != s.default]


_RULES: tuple[Callable[[EngineConfig], str | None], ...] = (_ceil_needs_auto, _preload_needs_cache,
                                                             _no_think_needs_chatml, _prompts_file_rules,
                                                             _drop_rules, _prefetch_rules, _traces_one_generation,
                                                             _route_ahead_rules, _guess_rules, _fidelity_rules)


def validate(cfg: EngineConfig) -> None:
    """Every declared range, choice, the stream-only rule (by value: a stream-only field away from its
    default needs --moe-stream, however it was spelled) and the cross-field rules. Raises UserError."""
    if any(getattr(cfg, s.name) for s in SPECS if s.flag.action):
        return
    for s in SPECS:
        v = getattr(cfg, s.name)
        if s.flag.required and not v:
            raise UserError(f"bmoe: no {s.name} given: pass {s.label} {s.metavar}")
        if v is None or s.switch:
            continue
        problem = _range_problem(s, v)
        if problem:
            raise UserError(problem)
        if s.flag.choices is not None and v not in (allowed := s.flag.choices()):
            raise UserError(f"bmoe: unknown {s.label} {v!r}; choose one of {', '.join(allowed)}")
    if not cfg.moe_stream:
        for s in SPECS:
            if s.flag.stream_only and getattr(cfg, s.name) != s.default:
                raise UserError(f"bmoe: {s.label} only applies with --moe-stream (add it, or drop {s.label})")
    for rule in _RULES:
        problem = rule(cfg)
        if problem:
            raise UserError(problem)


def validate_for_model(cfg: EngineConfig, n_expert: int, k_model: int) -> None:
    """The checks that need the model's numbers (read from its header, before loading it)."""
    if cfg.n_expert_used > n_expert:
        raise UserError(f"--n-expert-used {cfg.n_expert_used} is above the model's {n_expert} experts "
                        f"({cfg.model}); use 1..{n_expert}, or 0 for the model's own {k_model}")
