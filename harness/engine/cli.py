"""`bmoe`: the engine's command line. The only place that prints results, reads environment variables
and turns errors into one line and an exit status."""

from __future__ import annotations

import os
import sys

from harness import __version__
from harness.errors import UserError

EXIT_USER = 2
EXIT_ENGINE = 3


def _err(msg: str) -> None:
    sys.stderr.write(f"bmoe: error: {msg}\n" if not msg.startswith("bmoe:") else f"{msg}\n")
    sys.stderr.flush()


def _check_model_file(path: str) -> None:
    if not os.path.exists(path):
        raise UserError(f"{path}: no such model file; check the -m path")
    if os.path.isdir(path):
        raise UserError(f"{path}: is a directory; pass the .gguf file (first shard of a split model)")
    if not os.access(path, os.R_OK):
        raise UserError(f"{path}: permission denied; make the model file readable (chmod a+r)")


class _Interrupt:
    """Ctrl-C must never raise inside the ctypes eval callback: ctypes would swallow the exception and
    ggml could cut the graph short (garbage logits). So SIGINT only sets a flag, checked between tokens;
    a second Ctrl-C exits at once."""

    def __init__(self) -> None:
        self.hit = False

    def __call__(self, signum, frame) -> None:
        if self.hit:
            sys.stderr.write("bmoe: error: interrupted\n")
            os._exit(130)
        self.hit = True

    def check(self) -> None:
        if self.hit:
            raise KeyboardInterrupt


def run(argv: list[str]) -> int:
    import signal

    from harness.engine.config import parse_cli

    interrupt = _Interrupt()
    if signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:
        signal.signal(signal.SIGINT, interrupt)

    cfg = parse_cli(argv)
    if cfg.version:
        print(f"bmoe {__version__} (llama-cpp-python 0.3.36 pinned)")
        return 0
    if cfg.list_archs:
        from harness.engine.registry import list_archs_text

        print(list_archs_text())
        return 0
    _check_model_file(cfg.model)
    from harness.engine.gguf_layout import load_layout

    layout = load_layout(cfg.model)
    from harness.engine.session import Session
    from harness.formats.metrics_csv import MetricsWriter, TokenRow
    from harness.formats.progress import progress_line
    from harness.formats.route_trace import RouteTraceWriter

    corrupt = None
    if os.environ.get("BMOE_TEST_WRONG_EXPERT"):  # negative control for the byte-identity gate only
        corrupt = tuple(int(x) for x in os.environ["BMOE_TEST_WRONG_EXPERT"].split(","))
    fail_at = os.environ.get("BMOE_TEST_FAIL_AT_LAYER")  # gate: an exception in the callback surfaces
    use_c = os.environ.get("BMOE_HOOK", "c") != "python"  # BMOE_HOOK=python: measure the pure-Python front
    sess = Session(cfg, layout, corrupt=corrupt, fail_at_layer=int(fail_at) if fail_at else None,  # type: ignore[arg-type]
                   use_c_filter=use_c)
    csv = trace = None
    try:
        if cfg.moe_stream and sess.cache_plan:
            p = sess.cache_plan
            sys.stderr.write(f"bmoe: streaming {layout.arch}: {len(layout.by_layer)} MoE layers x {layout.n_expert} "
                             f"experts, k={sess.k_requested}, token cycle T={p.cycle_bytes / 1048576:.1f} MiB; "
                             f"cache {p.note}; policy {cfg.cache_policy}; {cfg.io_threads} lanes, "
                             f"O_DIRECT {'on' if sess.reader and sess.reader.odirect else 'off'}\n")
            if sess.reader and sess.reader.odirect_refused:
                sys.stderr.write(f"bmoe: {sess.reader.odirect_refused}\n")
        if cfg.route_replay:
            sys.stderr.write(f"bmoe: route replay from {cfg.route_replay}: routing follows the trace, so the output "
                             "text is meaningless; timings and bytes are the point\n")
        if cfg.csv:
            csv = MetricsWriter(cfg.csv, sess.preamble())
        if cfg.route_trace:
            trace = RouteTraceWriter(cfg.route_trace, cfg.model, layout.arch, layout.n_layer, layout.n_expert,
                                     sess.k_requested, layout.expert_bytes_per_layer(), layout.dense_bytes_by_layer)

        interrupt.check()  # a Ctrl-C during the load

        def on_token(row: TokenRow, text: str) -> None:
            interrupt.check()
            if cfg.progress:
                sys.stdout.write(progress_line(row, text) + "\n")
            else:
                sys.stdout.write(text)
            sys.stdout.flush()

        res = sess.run(on_token=on_token, csv=csv, trace=trace)
        if not cfg.progress:
            sys.stdout.write("\n")
        if csv:
            csv.summary(res.summary)
        if res.k_effective is not None:
            sys.stderr.write(f"bmoe: effective experts per token k={res.k_effective} (read from the graph)\n")
        sys.stderr.write(res.summary.human() + "\n")
    finally:
        if csv:
            csv.close()
        if trace:
            trace.close()
        sess.close()
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        return run(argv)
    except UserError as e:
        _err(str(e))
        return EXIT_USER
    except KeyboardInterrupt:
        _err("interrupted")
        return 130
    except BrokenPipeError:
        return 1
    except Exception as e:  # an engine failure: still one line, and a distinct status
        from harness.engine.hook import HookError
        from harness.engine.session import EngineError

        if isinstance(e, (EngineError, HookError)):
            _err(str(e))
            return EXIT_ENGINE
        if os.environ.get("BMOE_DEBUG"):
            raise
        _err(f"internal error: {type(e).__name__}: {e} (rerun with BMOE_DEBUG=1 for a traceback)")
        return EXIT_ENGINE


if __name__ == "__main__":
    sys.exit(main())
