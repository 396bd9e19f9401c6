"""`bmoe`: the engine's command line. The only place that prints results, reads environment variables
and turns errors into one line and an exit status: 2 a user error (a flag, a file), 3 an engine failure
(short reads and EIO on expert reads included), 4 a model file truncated or replaced under the running
engine (a SIGBUS in its mapping, caught by harness.engine.io.lazymap.watch_model_files; BMOE_MODEL_WATCH=thread
uses its pure-Python fallback), 28 an output on a full disk (naming its flag and path), 130 interrupted."""

from __future__ import annotations

import os
import sys

from harness import __version__
from harness.errors import BmoeError, EngineFailed, UserError

EXIT_USER = UserError.exit_code  # 2
EXIT_ENGINE = EngineFailed.exit_code  # 3
EXIT_MODEL_CHANGED = 4  # a model file truncated or replaced under the running engine (harness.engine.io.lazymap)


def _err(msg: str) -> None:
    sys.stderr.write(f"bmoe: error: {msg}\n" if not msg.startswith("bmoe:") else f"{msg}\n")
    sys.stderr.flush()


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


def _wants_hub(argv: list[str]) -> bool:
    return argv[:1] == ["pull"] or any(a in ("-hf", "--hf") or a.startswith(("-hf=", "--hf=")) for a in argv)


def _hub(argv: list[str]) -> list[str] | int:
    """`bmoe pull ...` (its exit status), or the command line with `-hf SPEC` pulled and given as `-m PATH`
    (harness.hub.command; imported only then)."""
    if not _wants_hub(argv):
        return argv
    from harness.hub.command import pull_main, rewrite_hf

    if argv[0] == "pull":
        return pull_main(argv[1:], os.environ)
    return rewrite_hf(argv, os.environ)


def run(argv: list[str]) -> int:
    import signal

    from harness.engine.serve.subcommands import parse

    hub = _hub(argv)
    if isinstance(hub, int):
        return hub
    argv = hub
    # before the SIGINT handler: a refused flag touches nothing (tests call this in-process)
    sub, cfg, serve_flags = parse(argv)
    interrupt = _Interrupt()
    if signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:
        signal.signal(signal.SIGINT, interrupt)
    if cfg.version:
        from harness.engine.model.pin import pinned_version

        pin = pinned_version()
        print(f"bmoe {__version__} (llama-cpp-python {pin} pinned)" if pin else
              f"bmoe {__version__} (not installed: llama-cpp-python's pin unknown)")
        return 0
    if cfg.list_archs:
        from harness.engine.model.registry import list_archs_text

        print(list_archs_text())
        return 0
    from harness.engine.compose import open_engine
    from harness.engine.io import lazymap
    from harness.engine.io.faults import Faults
    from harness.engine.run.paths import check_input_files

    check_input_files(cfg)  # a FIFO or a device given as a file: refused before anything reads it
    if cfg.fidelity_ref or cfg.fidelity_against:
        cfg = _fidelity_config(sub, cfg)
    sock = None
    if sub == "serve":  # before the slow load: a port in use or a bad --host is refused at once
        from harness.engine.serve.process import listen

        sock = listen(serve_flags)
    items = None
    if cfg.prompts_file:  # read before the slow load: a bad file is refused at once
        from harness.formats.replies import read_prompts

        items = read_prompts(cfg.prompts_file)
    faults = Faults.from_env(os.environ)  # the correctness gates' fault injection; None in real use
    use_c = os.environ.get("BMOE_HOOK", "c") != "python"  # BMOE_HOOK=python: measure the pure-Python front
    engine = open_engine(cfg, sys.stdout, use_c_filter=use_c, wrap_reader=faults.wrap if faults else None)
    try:
        lazymap.watch_model_files(list(engine.layout.shards), EXIT_MODEL_CHANGED,
                                  compiled=os.environ.get("BMOE_MODEL_WATCH") != "thread")
        for line in engine.notes():
            sys.stderr.write(line + "\n")
        load = engine.session.load
        if load.mode.populate and not lazymap.wants_populate(cfg.load_populate, cfg.moe_stream):
            sys.stderr.write(f"bmoe: the load read the whole model file: {load.mode.note}\n")
        interrupt.check()  # a Ctrl-C during the load
        if cfg.session:
            from harness.engine.serve.protocol import LineSession

            return LineSession(engine, sys.stdin, sys.stdout, interrupt.check).serve()
        if sub == "chat":
            from harness.engine.serve.chat import chat

            signal.signal(signal.SIGINT, signal.default_int_handler)  # the chat handles Ctrl-C itself
            return chat(engine)
        if sub == "serve":
            from harness.engine.serve.process import serve

            return serve(engine, serve_flags, sock)
        if cfg.fidelity_ref or cfg.fidelity_against:
            return _guarded(cfg, "--fidelity-ref" if cfg.fidelity_ref else "--fidelity-csv",
                            lambda: _run_fidelity(engine, cfg))
        if cfg.prompts_file:
            res = _guarded(cfg, "--replies", lambda: _run_prompts(engine, cfg, items, interrupt))
        else:
            res = engine.run(between_tokens=interrupt.check)
        if res.k_effective is not None:
            sys.stderr.write(f"bmoe: effective experts per token k={res.k_effective} (read from the graph)\n")
        sys.stderr.write(res.summary.human() + "\n")
        for line in engine.warnings():
            sys.stderr.write(line + "\n")
    finally:
        engine.close()
    return 0


def _guarded(cfg, flag: str, work):
    """work(), a failed write of the file `flag` names (read-only, full) as one line naming the flag and path."""
    import errno
    from pathlib import Path

    from harness.engine.run.paths import write_error

    try:
        return work()
    except OSError as e:
        path = getattr(cfg, flag[2:].replace("-", "_"))
        if not path or e.errno not in (errno.ENOSPC, errno.EDQUOT, errno.EACCES, errno.EPERM, errno.EROFS):
            raise
        tmp = Path(path).with_name(f".{Path(path).name}.{os.getpid()}.tmp")  # a file written whole, then renamed
        tmp.unlink(missing_ok=True)
        raise write_error(flag, path, e) from None


def _fidelity_config(sub: str | None, cfg):
    """--fidelity-ref/--fidelity-against: refused with chat or serve; against a reference, its context size."""
    from dataclasses import fields, replace

    from harness.engine.config import EngineConfig
    from harness.formats.fidelity import read_ref_header

    if sub:
        raise UserError(f"bmoe: --fidelity-ref and --fidelity-against score a fixed text; drop them from bmoe {sub}")
    if not cfg.fidelity_against:
        return cfg
    ctx = int(read_ref_header(cfg.fidelity_against)["ctx"])  # before the slow load: a bad file is refused at once
    default = next(f.default for f in fields(EngineConfig) if f.name == "ctx")
    if cfg.ctx not in (ctx, default):  # the default: -c not given
        raise UserError(f"bmoe: --fidelity-against {cfg.fidelity_against} was scored with -c {ctx}; drop -c "
                        f"{cfg.ctx} (the reference's context size is used)")
    return replace(cfg, ctx=ctx)


def _run_fidelity(engine, cfg) -> int:
    from harness.engine.run.fidelity import score_against, score_ref

    if cfg.fidelity_ref:
        res = score_ref(engine, cfg.fidelity_ref, cfg.fidelity_top_k)
        sys.stderr.write(f"bmoe: wrote the reference {cfg.fidelity_ref} (top {cfg.fidelity_top_k or 'all'})\n")
    else:
        res = score_against(engine, cfg.fidelity_against, cfg.fidelity_csv)
    for line in res.lines():
        sys.stderr.write(line + "\n")
    return 0


def _run_prompts(engine, cfg, items, interrupt: _Interrupt):
    """--prompts-file: every prompt answered in this process; the last turn's result for the summary line."""
    from harness.formats.replies import RepliesWriter

    replies = RepliesWriter(cfg.replies) if cfg.replies else None
    try:
        results = engine.run_prompts(items, replies, between_tokens=interrupt.check)
    finally:
        if replies is not None:
            replies.close()
    sys.stderr.write(f"bmoe: answered {len(results)} prompts from {cfg.prompts_file} in one process\n")
    return results[-1]


def _reexec_with_shim(argv: list[str]) -> None:
    """Re-execute this command (`argv`: its arguments, -hf already pulled and given as -m) once with the mmap shim
    preloaded (harness.engine.io.lazymap), so that the load reads only what is used; returns when that is not needed
    or not possible (the load then populates)."""
    from harness.engine.io import lazymap
    from harness.engine.serve.subcommands import parse

    lazymap.restore_preload_env()
    try:
        cfg = parse(argv)[1]
    except UserError:
        return  # run() reports it
    if cfg.version or cfg.list_archs or lazymap.wants_populate(cfg.load_populate, cfg.moe_stream) \
            or lazymap.preloaded():
        return
    env = lazymap.reexec_env(os.environ)
    if env is None:
        return
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        launcher = sys.orig_argv[1:len(sys.orig_argv) - (len(sys.argv) - 1)]  # interpreter flags, script or -m
        os.execve(sys.executable, [sys.executable, *launcher, *argv], env)
    except OSError as e:
        sys.stderr.write(f"bmoe: could not re-execute with the mmap shim ({e.strerror}); loading as llama.cpp does\n")


def main(argv: list[str] | None = None) -> int:
    try:
        if argv is None:
            hub = _hub(sys.argv[1:])  # before the re-execution: it runs the pulled file, and pulls nothing again
            if isinstance(hub, int):
                return hub
            argv = hub
            _reexec_with_shim(argv)
        return run(argv)
    except BmoeError as e:  # a user error (EXIT_USER), an engine failure (EXIT_ENGINE): the engine raises no other kind
        _err(str(e))
        return e.exit_code
    except KeyboardInterrupt:
        _err("interrupted")
        return 130
    except BrokenPipeError:
        return 1
    except Exception as e:  # a bug: still one line, and the engine failure's status
        if os.environ.get("BMOE_DEBUG"):
            raise
        _err(f"internal error: {type(e).__name__}: {e} (rerun with BMOE_DEBUG=1 for a traceback)")
        return EXIT_ENGINE


if __name__ == "__main__":
    sys.exit(main())
