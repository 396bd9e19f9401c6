"""Engine configuration: the `bmoe` flags, parsed and validated without importing llama.cpp.

`parse_cli(argv)` is pure (no file access beyond nothing): the harness uses it to refuse, at campaign
validation time, any flag combination the engine itself would refuse. Checks that need the model file
(expert count, token cycle) happen at load, in the session.
"""

from __future__ import annotations

import argparse
from dataclasses import asdict, dataclass, field

from harness.engine.policies import ONLINE_DEFAULT, POLICIES
from harness.errors import UserError

IO_THREADS_MAX = 8


@dataclass
class EngineConfig:
    model: str = ""
    prompt: str = "Explain MoE routing."
    n_predict: int = 64
    threads: int = 0  # 0 = llama.cpp's default for this machine
    ctx: int = 512
    moe_stream: bool = False
    cache_mb: int | None = None  # None = auto
    cache_ceil_mb: int | None = None
    force_cache: bool = False
    cache_preload: bool = False
    io_threads: int = 4
    odirect: bool = True
    n_expert_used: int = 0  # 0 = the model's own
    cache_policy: str = ONLINE_DEFAULT
    chatml: bool = False
    temp: float = 0.0  # greedy by default
    top_k: int = 40
    top_p: float = 0.95
    seed: int = 42
    csv: str | None = None
    progress: bool = False
    route_trace: str | None = None
    route_replay: str | None = None
    list_archs: bool = False
    version: bool = False
    extra: dict[str, str] = field(default_factory=dict)

    @property
    def cache_mode(self) -> str:
        return "auto" if self.cache_mb is None else str(self.cache_mb)

    def resolved(self) -> dict[str, object]:
        """Flat key -> value view for CSV preambles (every knob, stable order)."""
        d = asdict(self)
        d.pop("extra")
        d.pop("list_archs")
        d.pop("version")
        d["cache_mb"] = self.cache_mode
        return d


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, no usage dump
        raise UserError(f"bmoe: {message} (see bmoe --help)")


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


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="bmoe",
        description="Run a MoE GGUF model with its routed experts streamed from flash "
        "(--moe-stream), or as the plain mmap baseline. Output text goes to stdout; "
        "diagnostics and the end-of-run summary go to stderr.",
    )
    a = p.add_argument
    a("-m", "--model", default="", help="GGUF model (first shard of a split model)")
    a("-p", "--prompt", default=EngineConfig.prompt, help="prompt text")
    a("-n", "--n-predict", type=int, default=64, help="tokens to generate (default 64)")
    a("-t", "--threads", type=int, default=0, help="compute threads (0 = llama.cpp default)")
    a("-c", "--ctx", type=int, default=512, help="context size in tokens (default 512)")
    a("--moe-stream", action="store_true", help="stream routed experts from flash instead of mmap")
    a("--cache-mb", type=_cache_mb, default=None, metavar="0|N|auto",
      help="expert cache budget in MiB; 0 = no cache; auto = from MemAvailable at load (default)")
    a("--cache-ceil-mb", type=int, default=None, help="ceiling for --cache-mb auto, MiB")
    a("--force-cache", action="store_true", help="accept a cache budget below one token cycle")
    a("--cache-preload", action="store_true",
      help="read every expert into the cache at its first pass (needs a budget >= all experts)")
    a("--cache-policy", default=ONLINE_DEFAULT, help=f"eviction policy (default {ONLINE_DEFAULT})")
    a("--io-threads", type=int, default=4, help=f"parallel read lanes 1..{IO_THREADS_MAX} (default 4)")
    a("--no-odirect", action="store_true", help="buffered reads instead of O_DIRECT")
    a("--n-expert-used", type=int, default=0,
      help="active experts per token (0 = the model's own; fewer is LOSSY)")
    a("--chatml", action="store_true", help="wrap the prompt in the model's own chat template")
    a("--temp", type=float, default=0.0, help="sampling temperature (0 = greedy, the default)")
    a("--top-k", type=int, default=40)
    a("--top-p", type=float, default=0.95)
    a("--seed", type=int, default=42)
    a("--csv", default=None, help="write the per-token bmoe_metrics v2 CSV here")
    a("--progress", action="store_true", help="print BMOE_PROGRESS {json} lines per token on stdout")
    a("--route-trace", default=None, help="write the route_trace v1 file here (with --moe-stream)")
    a("--route-replay", default=None, metavar="TRACE",
      help="drive routing with a recorded route_trace v1 (benchmarks: real access pattern on a synthetic "
      "model of the same shape; the output text is then meaningless)")
    a("--list-archs", action="store_true", help="print the supported MoE architectures and exit")
    a("--version", action="store_true", help="print the version and exit")
    return p


def parse_cli(argv: list[str]) -> EngineConfig:
    """Parse and validate `bmoe` flags. Raises UserError with one line on any problem."""
    ns = build_parser().parse_args(argv)
    cfg = EngineConfig(
        model=ns.model, prompt=ns.prompt, n_predict=ns.n_predict, threads=ns.threads, ctx=ns.ctx,
        moe_stream=ns.moe_stream, cache_mb=ns.cache_mb, cache_ceil_mb=ns.cache_ceil_mb,
        force_cache=ns.force_cache, cache_preload=ns.cache_preload, io_threads=ns.io_threads, odirect=not ns.no_odirect,
        n_expert_used=ns.n_expert_used, cache_policy=ns.cache_policy, chatml=ns.chatml, temp=ns.temp,
        top_k=ns.top_k, top_p=ns.top_p, seed=ns.seed, csv=ns.csv, progress=ns.progress,
        route_trace=ns.route_trace, route_replay=ns.route_replay, list_archs=ns.list_archs, version=ns.version,
    )
    validate(cfg, argv)
    return cfg


_STREAM_ONLY = ("--cache-mb", "--cache-ceil-mb", "--force-cache", "--cache-preload", "--cache-policy",
                "--io-threads", "--no-odirect", "--route-trace")


def validate(cfg: EngineConfig, argv: list[str] | None = None) -> None:
    if cfg.list_archs or cfg.version:
        return
    if not cfg.model:
        raise UserError("bmoe: no model given: pass -m MODEL.gguf")
    if cfg.n_predict < 1:
        raise UserError(f"bmoe: -n must be >= 1, got {cfg.n_predict}")
    if cfg.ctx < 16:
        raise UserError(f"bmoe: -c must be >= 16, got {cfg.ctx}")
    if cfg.threads < 0:
        raise UserError(f"bmoe: -t must be >= 0, got {cfg.threads}")
    if not 1 <= cfg.io_threads <= IO_THREADS_MAX:
        raise UserError(f"bmoe: --io-threads must be 1..{IO_THREADS_MAX}, got {cfg.io_threads}")
    if cfg.n_expert_used < 0:
        raise UserError(f"bmoe: --n-expert-used must be >= 0 (0 = the model's own), got {cfg.n_expert_used}")
    if cfg.cache_ceil_mb is not None and cfg.cache_ceil_mb < 0:
        raise UserError(f"bmoe: --cache-ceil-mb must be >= 0, got {cfg.cache_ceil_mb}")
    if cfg.cache_ceil_mb is not None and cfg.cache_mb is not None:
        raise UserError("bmoe: --cache-ceil-mb caps --cache-mb auto; it makes no sense with a fixed --cache-mb")
    if cfg.cache_policy not in POLICIES or getattr(POLICIES[cfg.cache_policy], "offline", False):
        online = sorted(n for n, c in POLICIES.items() if not getattr(c, "offline", False))
        raise UserError(f"bmoe: unknown --cache-policy {cfg.cache_policy!r}; choose one of {', '.join(online)}")
    if cfg.temp < 0:
        raise UserError(f"bmoe: --temp must be >= 0, got {cfg.temp}")
    if not cfg.moe_stream and argv is not None:
        given = [f for f in _STREAM_ONLY if any(x == f or x.startswith(f + "=") for x in argv)]
        if given:
            raise UserError(f"bmoe: {given[0]} only applies with --moe-stream (add it, or drop {given[0]})")
    if cfg.cache_preload and cfg.cache_mb == 0:
        raise UserError("bmoe: --cache-preload needs a cache: drop --cache-mb 0")
    if cfg.route_trace and not cfg.moe_stream:
        raise UserError("bmoe: --route-trace needs --moe-stream")
