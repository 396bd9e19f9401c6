"""The declaration: one `EngineConfig` field per `bmoe` flag, its metadata, and the parser built from it."""

from __future__ import annotations

import argparse
import types
import typing
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

from harness.engine.cache.budget import BudgetAsk
from harness.engine.cache.policies import ONLINE_DEFAULT, POLICIES, is_offline
from harness.engine.guess.exactness import MAX_DRAFT, TILED_MIN_ROWS
from harness.engine.io.dense import MODES as DENSE_MODES
from harness.errors import UserError

IO_THREADS_MAX = 8
FIDELITY_TOP_K = 256  # see harness/kld.py and bench-data notes: what a smaller K loses
_META = "bmoe.flag"


@dataclass(frozen=True)
class Flag:
    """How one EngineConfig field appears on the command line (the declaration's metadata)."""

    flags: tuple[str, ...]  # the first one names the field in error messages
    help: str
    metavar: str = ""  # value flags only; default from the type: N, X, TEXT
    lo: float | None = None  # inclusive range, checked by validate()
    hi: float | None = None
    choices: Callable[[], Sequence[str]] | None = None  # a callable: the set may come from a registry
    stream_only: bool = False  # a value other than the default needs --moe-stream
    lossy: str = ""  # when the output can differ from the model's own ("" = never)
    parse: Callable[[str], Any] | None = None  # value flags: str -> value (default: the annotated type)
    show: Callable[[Any], object] | None = None  # the value as written in the preamble and the README
    required: bool = False  # unless an action flag is given
    action: bool = False  # print something and exit (--version): not part of the run's configuration
    writes: bool = False  # a PATH the run writes (its directory must exist before the load: compose.check_output_paths)


def opt(default: Any, *flags: str, help: str, **kw: Any) -> Any:
    """One declared field: `name: type = opt(default, "-x", "--long", help=..., lo=..., stream_only=...)`."""
    return field(default=default, metadata={_META: Flag(tuple(flags), help, **kw)})


def _cache_mb(v: str) -> int | None:
    if v == "auto":
        return None
    try:
        n = int(v)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--cache-mb takes 0, a number of MiB or 'auto', not {v!r}") from None
    if n < 0:
        raise argparse.ArgumentTypeError(f"--cache-mb must be >= 0, got {n}")
    return n


def _auto(v: int | None) -> str:
    return "auto" if v is None else str(v)


def _online_policies() -> list[str]:
    return sorted(n for n in POLICIES if not is_offline(n))


@dataclass
class EngineConfig:
    model: str = opt("", "-m", "--model", metavar="PATH", required=True,
                     help="GGUF model (first shard of a split model)")
    prompt: str = opt("Explain MoE routing.", "-p", "--prompt", metavar="TEXT", help="prompt text")
    n_predict: int = opt(64, "-n", "--n-predict", lo=1, help="tokens to generate")
    threads: int = opt(0, "-t", "--threads", lo=0, help="compute threads (0 = one per core this process may use)")
    ctx: int = opt(512, "-c", "--ctx", lo=16, help="context size in tokens")
    flash_attn: str = opt("off", "--flash-attn", metavar="off|on|auto", choices=lambda: ("off", "on", "auto"),
                          help="llama.cpp's flash attention (auto: llama.cpp's own default, as the C++ original runs "
                          "it); off keeps a --ngram/--mtp verify batch bit-exact against one-token decoding, which "
                          "on CPU splits a long KV cache (512+ cells) over the threads")
    moe_stream: bool = opt(False, "--moe-stream", help="stream routed experts from flash instead of the mmap baseline")
    cache_mb: int | None = opt(None, "--cache-mb", metavar="0|N|auto", parse=_cache_mb, show=_auto, lo=0,
                               stream_only=True,
                               help="expert cache budget in MiB; 0 = no cache; auto = MemAvailable (and the cgroup "
                               "limit) at load, less the dense weights and 256 MiB headroom; none when that is "
                               "below one token cycle")
    cache_ceil_mb: int | None = opt(None, "--cache-ceil-mb", lo=0, stream_only=True,
                                    help="ceiling for --cache-mb auto, MiB")
    force_cache: bool = opt(False, "--force-cache", stream_only=True,
                            help="accept a cache budget below one token cycle T (recency policies hit ~0% there), "
                            "or one that will not fit under the memory cgroup's limit (a warning; the OOM killer may "
                            "end the run)")
    cache_preload: bool = opt(False, "--cache-preload", stream_only=True,
                              help="read every expert into the cache at its first pass (needs a budget >= all experts)")
    io_threads: int = opt(4, "--io-threads", lo=1, hi=IO_THREADS_MAX, stream_only=True, help="parallel read lanes")
    prefetch: int = opt(0, "--prefetch", metavar="K", lo=0, stream_only=True,
                        help="lossless: at each layer's routing in decode, read into the cache on idle lanes the "
                        "experts the previous token used at the next K MoE layers (0 = off; needs a cache)")
    predict_prefetch: bool = opt(False, "--predict-prefetch", stream_only=True,
                                 help="lossless: at each decode layer, run the next MoE layer's router early on "
                                 "this layer's MoE input and read the experts it names into the cache on idle lanes "
                                 "(needs a cache)")
    predict_min_recall: float = opt(0.0, "--predict-min-recall", metavar="R", lo=0, hi=1, stream_only=True,
                                    help="with --predict-prefetch: read a layer's named experts only while the "
                                    "early router's recall there, measured on this run's decode tokens so far "
                                    "(after 8 of them), is at least R (0 = always read); it goes on naming and "
                                    "measuring every layer (lossless)")
    predict_spec_max: int = opt(0, "--predict-spec-max", metavar="N", lo=0, stream_only=True,
                                help="with --predict-prefetch: read at most N of the named experts per layer, best "
                                "first (0 = all it names: k)")
    prefetch_lanes: int = opt(0, "--prefetch-lanes", lo=0, hi=IO_THREADS_MAX, stream_only=True,
                              help="speculative (prefetch) reads in flight at most (0 = --io-threads - 1, at least 1); "
                              "demand reads always go first")
    odirect: bool = opt(True, "--no-odirect", stream_only=True, help="buffered reads instead of O_DIRECT")
    recycle_pages: str = opt("auto", "--recycle-pages", metavar="auto|off|move|memfd", stream_only=True,
                             choices=lambda: ("auto", "off", "move", "memfd"),
                             help="lossless: an evicted expert's pages go to the next miss instead of being freed and "
                             "faulted again: move = the read lanes move them with UFFDIO_MOVE (Linux 6.8+), memfd = "
                             "chunks of a memfd pool mapped over the slice; the pages held beyond the cache are at "
                             "most one release batch (move and memfd need a cache); auto = move with a cache where "
                             "the kernel can, else off (the CSV's recycle_pages_effective says which and why)")
    evict_thread: bool = opt(True, "--no-evict-thread", stream_only=True,
                             help="decide decode evictions on the compute thread instead of a helper thread (same "
                             "decisions)")
    n_expert_used: int = opt(0, "--n-expert-used", lo=0, lossy="below the model's own",
                             help="active experts per token (0 = the model's own)")
    cache_policy: str = opt(ONLINE_DEFAULT, "--cache-policy", metavar="NAME", choices=_online_policies,
                            stream_only=True, help="eviction policy (`bmoe-bench replay` compares them)")
    dense_weights: str = opt("auto", "--dense-weights", metavar="mmap|warm|anon|auto",
                             choices=lambda: (*DENSE_MODES, "auto"),
                             help="where the dense (non-expert) weights live: mmap = llama.cpp's file mapping; "
                             "warm = the mapping, read once at load; anon = read into anonymous memory at load, "
                             "so page-cache pressure cannot evict them; auto = anon with --moe-stream, mmap "
                             "without (the plain run stays llama.cpp's own)")
    load_populate: str = opt("auto", "--load-populate", metavar="auto|on|off", choices=lambda: ("auto", "on", "off"),
                             help="on: read the whole model file at load, as llama.cpp does (MAP_POPULATE); off: "
                                  "bmoe's mmap shim maps it unpopulated, so the load reads only what is used; "
                                  "auto: off when streamed, on for the plain mmap run")
    chatml: bool = opt(False, "--chatml", help="wrap the prompt in the model's own chat template")
    no_think: bool = opt(False, "--no-think", lossy="changes the reply: no reasoning before the answer",
                         help="suppress reasoning by the model's own chat template (harmony: final channel; "
                         "enable_thinking=false), recorded in the preamble's no_think; needs --chatml")
    temp: float = opt(0.0, "--temp", lo=0, help="sampling temperature (0 = greedy)")
    top_k: int = opt(40, "--top-k", help="top-k sampling (with --temp > 0)")
    top_p: float = opt(0.95, "--top-p", help="top-p sampling (with --temp > 0)")
    seed: int = opt(42, "--seed", help="sampling seed (with --temp > 0)")
    csv: str | None = opt(None, "--csv", metavar="PATH", writes=True,
                          help="write the per-token bmoe_metrics v2 CSV here (its preamble: the full resolved "
                          "configuration)")
    progress: bool = opt(False, "--progress", help="print BMOE_PROGRESS {json} lines per token on stdout")
    prompts_file: str | None = opt(None, "--prompts-file", metavar="PATH",
                                   help="answer every prompt of a bmoe-prompts v1 file (JSON lines) in this one "
                                   "process, greedy: each prompt is one CSV turn, the KV cache cleared between "
                                   "prompts, the model and the expert cache kept; -p is then not used")
    replies: str | None = opt(None, "--replies", metavar="PATH", writes=True,
                              help="with --prompts-file: write each reply (id, prompt as sent, reply, tokens, "
                              "times) here as bmoe-replies v1 JSON lines")
    fidelity_ref: str | None = opt(None, "--fidelity-ref", metavar="OUT",
                                   help="score the -p text teacher-forced instead of generating (chunks of -c "
                                   "tokens, llama-perplexity's --kl-divergence layout: positions c/2..c-2 of each "
                                   "chunk) and write the run's log-probabilities here (bmoe_fidelity_ref v1)")
    fidelity_top_k: int = opt(FIDELITY_TOP_K, "--fidelity-top-k", metavar="K", lo=0,
                              help="with --fidelity-ref: keep each position's K most probable tokens and the rest's "
                              "mass as one outcome (0 = the whole vocabulary: exact, 8 bytes per token per position)")
    fidelity_chunks: int = opt(0, "--fidelity-chunks", metavar="N", lo=0,
                               help="with --fidelity-ref: score the text's first N chunks (0 = every whole chunk)")
    fidelity_against: str | None = opt(None, "--fidelity-against", metavar="REF",
                                       help="score the tokens of a --fidelity-ref file with this run's knobs instead "
                                       "of generating (its context size and chunks) and print KLD(ref||run), "
                                       "same-top % and the next token's probability change (no -p needed)")
    fidelity_csv: str | None = opt(None, "--fidelity-csv", metavar="PATH",
                                   help="with --fidelity-against: write the per-position figures here "
                                   "(bmoe_fidelity v2)")
    fidelity_decode: bool = opt(False, "--fidelity-decode",
                                help="with --fidelity-ref or --fidelity-against: decode the text one token at a time "
                                "(each chunk's first token, then one llama_decode per position) instead of one batch "
                                "per chunk, so every decode-time knob (--drop-cold-experts, --route-ahead, "
                                "--prefetch, the cache) acts as in generation; a reference and the runs against it "
                                "must use the same mode")
    session: bool = opt(False, "--session", help="keep the model loaded and answer JSON-lines requests on stdin "
                        "(generate with messages, cancel, close) with JSON-lines events on stdout; -p is unused")
    kv_reuse: bool = opt(True, "--no-kv-reuse",
                         help="--session, chat, serve: prefill every turn's whole prompt in one batch instead of "
                         "keeping the prompt prefix already in the KV cache; each reply is then bit-identical to a "
                         "fresh run of the same prompt (llama.cpp's CPU kernels are not batch-size invariant, so a "
                         "reused prefix can change a near-tie)")
    route_trace: str | None = opt(None, "--route-trace", metavar="PATH", writes=True, stream_only=True,
                                  help="write the route_trace v1 file of every routing decision here")
    io_trace: str | None = opt(None, "--io-trace", metavar="PATH", writes=True, stream_only=True,
                               help="write the io_trace v1 file here: one row per expert-slice read (token, layer, "
                               "expert, lane, file offset, bytes, issued/started/finished ns, demand or speculative, "
                               "used or wasted); tracing perturbs the run slightly")
    compute_trace: str | None = opt(None, "--compute-trace", metavar="PATH", writes=True, stream_only=True,
                                    help="write the compute_trace v1 file here: the compute thread's time per token "
                                    "and layer span (compute, wait on reads, hook), on the io_trace's clock; "
                                    "tracing perturbs the run slightly")
    route_replay: str | None = opt(None, "--route-replay", metavar="TRACE",
                                   help="drive routing with a recorded route_trace v1 (benchmarks: a real access "
                                   "pattern on a synthetic model of the same shape; the output text is then "
                                   "meaningless)")
    drop_cold_experts: float | None = opt(None, "--drop-cold-experts", metavar="F", lo=0, hi=1, stream_only=True,
                                          lossy="skips experts; not reproducible: the cache state decides which",
                                          help="skip a routed expert when it is a cache miss and its share of the "
                                          "token's router weight is below F x 1/k (0..1; 0 skips none): its weight "
                                          "becomes 0 and the kept ones are renormalised; decode only; needs a cache")
    drop_no_renorm: bool = opt(False, "--drop-no-renorm",
                               help="with a drop: leave the kept experts' weights as they are")
    drop_in_prefill: bool = opt(False, "--drop-in-prefill",
                                help="with --drop-cold-experts: drop in the prompt's batch too")
    drop_replay: str | None = opt(None, "--drop-replay", metavar="TRACE", lossy="skips the experts the trace dropped",
                                  help="skip the experts a route_trace v2 recorded as dropped instead of deciding "
                                  "(the gate: a streamed run with drops equals the resident run under its drops)")
    route_ahead: int = opt(0, "--route-ahead", lo=0,
                           lossy="a decode layer's routing comes from an earlier layer's input",
                           help="commit each decode layer's routing N MoE layers early (its router on that layer's "
                           "MoE input), so its reads start N layers early and are never wasted; the first N MoE "
                           "layers and the prompt route themselves; 0 = off; deterministic: streamed equals resident "
                           "at the same N")
    ngram: bool = opt(False, "--ngram",
                      help="guess ahead by prompt lookup: propose the continuation of the latest earlier occurrence "
                      "of the last --ngram-size tokens (prompt and reply), verify the guesses in one batch and keep "
                      "the longest prefix greedy decoding would have produced (greedy only; lossless on a llama.cpp "
                      "built by scripts/setup.sh, without llamafile's sgemm, whose batched matmuls round differently "
                      "from one-token decoding: the engine says so on stderr when it is loaded)")
    mtp: bool = opt(False, "--mtp",
                    help="guess ahead with the model's own MTP (nextn) head through llama.cpp's MTP context: draft "
                    "--draft tokens (one head, chained on its own hidden state), verify them in one batch and keep "
                    "the longest prefix greedy decoding would have produced (greedy only; lossless as --ngram is; "
                    "models with a nextn layer; the head's weights, its experts included, are read through the "
                    "file mapping, not streamed)")
    draft: int = opt(4, "--draft", lo=1, hi=MAX_DRAFT, help="with --ngram or --mtp: tokens guessed per verify batch "
                     f"(at most {MAX_DRAFT}: from {TILED_MIN_ROWS} rows ggml-cpu's tiled K-quant matmul would round a "
                     "batch differently)")
    ngram_size: int = opt(3, "--ngram-size", lo=1, hi=8, help="with --ngram: tokens matched to find a guess")
    list_archs: bool = opt(False, "--list-archs", action=True, help="print the supported MoE architectures and exit")
    version: bool = opt(False, "--version", action=True, help="print the version and exit")

    def budget_ask(self) -> BudgetAsk:
        """The cache budget's inputs, as values (harness.engine.cache.budget.plan_cache)."""
        return BudgetAsk(self.cache_mb, self.cache_ceil_mb, self.cache_preload, self.force_cache)

    def resolved(self) -> dict[str, object]:
        """Flat key -> value view for CSV preambles (every knob of the run, declaration order)."""
        return {s.name: s.shown(getattr(self, s.name)) for s in SPECS if not s.flag.action}


# -- the declaration, read once ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Spec:
    name: str
    flag: Flag
    type: type  # int, float, str or bool (Optional unwrapped)
    default: Any

    @property
    def label(self) -> str:
        return self.flag.flags[0]

    @property
    def switch(self) -> bool:
        return self.type is bool

    @property
    def metavar(self) -> str:
        return self.flag.metavar or {int: "N", float: "X"}.get(self.type, "TEXT")

    def shown(self, v: Any) -> object:
        return self.flag.show(v) if self.flag.show else v


def _base_type(hint: Any) -> type:
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        if len(args) != 1:
            raise TypeError(f"config field type {hint} must be T or T | None")
        return args[0]
    return hint


def _specs() -> tuple[Spec, ...]:
    hints = typing.get_type_hints(EngineConfig)
    out = []
    for f in fields(EngineConfig):
        t = _base_type(hints[f.name])
        if t not in (int, float, str, bool):
            raise TypeError(f"config field {f.name}: type {t} is not int, float, str or bool")
        out.append(Spec(f.name, f.metadata[_META], t, f.default))
    return tuple(out)


SPECS: tuple[Spec, ...] = _specs()


# -- parser ------------------------------------------------------------------------------------------------


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> typing.NoReturn:  # one line, no usage dump
        raise UserError(f"bmoe: {message} (see bmoe --help)")


def _help(s: Spec) -> str:
    h = s.flag.help
    if not s.switch and s.shown(s.default) not in (None, ""):
        h += f" (default {s.shown(s.default)})"
    if s.flag.lossy:
        h += f"; LOSSY {s.flag.lossy}"
    if s.flag.stream_only:
        h += "; with --moe-stream"
    return h.replace("%", "%%")  # argparse formats help with %


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="bmoe", allow_abbrev=False,
        description="Run a MoE GGUF model with its routed experts streamed from flash "
        "(--moe-stream), or as the plain mmap baseline. Output text goes to stdout; "
        "diagnostics and the end-of-run summary go to stderr.",
    )
    for s in SPECS:
        if s.switch:  # a switch whose default is True is spelled --no-<x> and turns it off
            p.add_argument(*s.flag.flags, dest=s.name, action="store_false" if s.default else "store_true",
                           help=_help(s))
        else:
            p.add_argument(*s.flag.flags, dest=s.name, type=s.flag.parse or s.type, default=s.default,
                           metavar=s.metavar, help=_help(s))
    return p
