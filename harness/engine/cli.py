"""`bmoe`: the engine's command line. The only place that prints results, reads environment variables
and turns errors into one line and an exit status: 2 a user error (a flag, a file), 3 an engine failure
(short reads and EIO on expert reads included), 4 a model file truncated or replaced under the running
engine (a SIGBUS in its mapping, caught by harness.engine.io.lazymap.watch_model_files; BMOE_MODEL_WATCH=thread
uses its pure-Python fallback), 28 an output on a full disk (naming its flag and path), 130 interrupted."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from harness import __version__
from harness.errors import BmoeError, EngineFailed, UserError

if TYPE_CHECKING:
    from harness.engine.config import EngineConfig
    from harness.engine.serve.subcommands import ServeFlags

EXIT_USER = UserError.exit_code  # 2
EXIT_ENGINE = EngineFailed.exit_code  # 3
EXIT_MODEL_CHANGED = 4  # a model file truncated or replaced under the running engine (harness.engine.io.lazymap)


def _err(msg: str) -> None:
    sys.stderr.write(f"bmoe: error: {msg}\n" if not msg.startswith("bmoe:") else f"{msg}\n")
    sys.stderr.flush()


@dataclass(frozen=True)
class Environment:
    """Every environment variable `bmoe` reads, read once here (`read`) and handed on as values."""

    python_lanes: bool = False  # BMOE_PURE_PYTHON_LANES=1: the Python read lanes (harness.engine.io.clanes)
    reference_policies: bool = False  # BMOE_PURE_PYTHON_POLICIES set, not 0: the policies' numpy reference
    c_hook: bool = True  # BMOE_HOOK=python: measure the pure-Python callback front
    compiled_watch: bool = True  # BMOE_MODEL_WATCH=thread: the model watch's pure-Python fallback
    debug: bool = False  # BMOE_DEBUG: a traceback for an internal error
    api_key: str = ""  # BMOE_API_KEY: bmoe serve's key when --api-key is not given
    test_faults: Mapping[str, str] = field(default_factory=dict)  # BMOE_TEST_*: the gates' faults (io/faults.py)

    @classmethod
    def read(cls, env: Mapping[str, str]) -> Environment:
        return cls(python_lanes=env.get("BMOE_PURE_PYTHON_LANES") == "1",
                   reference_policies=env.get("BMOE_PURE_PYTHON_POLICIES", "") not in ("", "0"),
                   c_hook=env.get("BMOE_HOOK", "c") != "python", compiled_watch=env.get("BMOE_MODEL_WATCH") != "thread",
                   debug=bool(env.get("BMOE_DEBUG")), api_key=env.get("BMOE_API_KEY", ""),
                   test_faults={k: v for k, v in env.items() if k.startswith("BMOE_TEST_")})


@dataclass(frozen=True)
class Command:
    """The command line, parsed once: the subcommand (chat, serve or None), the engine's config, serve's flags."""

    sub: str | None
    cfg: EngineConfig
    serve: ServeFlags


def _serve_parser() -> argparse.ArgumentParser:
    from harness.engine.serve.subcommands import ServeFlags

    p = argparse.ArgumentParser(prog="bmoe serve", add_help=False, allow_abbrev=False)
    p.add_argument("--host", default=ServeFlags.host)
    p.add_argument("--port", type=int, default=ServeFlags.port)
    p.add_argument("--queue", type=int, default=ServeFlags.queue)
    p.add_argument("--model-name", default="")
    p.add_argument("--max-body-kb", type=int, default=ServeFlags.max_body_kb)
    p.add_argument("--api-key", default=None)
    p.add_argument("--allow-host", action="append", default=[])
    p.add_argument("--tokenize-timeout", type=float, default=ServeFlags.tokenize_timeout)
    return p


def split(argv: list[str], api_key: str = "") -> tuple[str | None, list[str], ServeFlags]:
    """(subcommand or None, the engine's flags, the server's flags); `api_key`: BMOE_API_KEY's value."""
    from harness.engine.serve.subcommands import NAMES, ServeFlags

    if not argv or argv[0] not in NAMES:
        return None, argv, ServeFlags()
    name, rest = argv[0], argv[1:]
    if name == "chat":
        return name, rest, ServeFlags()
    ns, rest = _serve_parser().parse_known_args(rest)
    if not 0 <= ns.port <= 65535:
        raise UserError(f"bmoe serve: --port must be 0..65535, got {ns.port}")
    if ns.queue < 0:
        raise UserError(f"bmoe serve: --queue must be >= 0, got {ns.queue}")
    if ns.max_body_kb < 1:
        raise UserError(f"bmoe serve: --max-body-kb must be >= 1, got {ns.max_body_kb}")
    if not 0 < ns.tokenize_timeout <= 3600:
        raise UserError(f"bmoe serve: --tokenize-timeout must be 0 < S <= 3600 seconds, got {ns.tokenize_timeout}")
    key = ns.api_key if ns.api_key is not None else api_key
    if ns.api_key is not None and not key:
        raise UserError("bmoe serve: --api-key is empty; give a key, or drop the flag to serve without one")
    if key and (not key.isprintable() or not key.isascii() or " " in key):
        raise UserError("bmoe serve: the API key must be printable ASCII without spaces (it travels in an HTTP header)")
    hosts = tuple(h.strip() for h in ns.allow_host)
    if any(not h for h in hosts):
        raise UserError("bmoe serve: --allow-host needs a name (or '*' for any Host header)")
    return name, rest, ServeFlags(ns.host, ns.port, ns.queue, ns.model_name, ns.max_body_kb, key, hosts,
                                 ns.tokenize_timeout)


def parse(argv: list[str], env: Environment) -> Command:
    """The whole command line (-hf already pulled and given as -m), the only place it is parsed."""
    from harness.engine.config import parse_cli
    from harness.engine.model import default_model
    from harness.engine.serve.subcommands import CHAT_HELP, SERVE_HELP

    name, rest, sf = split(argv, env.api_key)
    if name and not default_model.has_model_flag(rest) and not any(a in ("-h", "--help") for a in rest):
        rest = ["-m", str(default_model.path()), *rest]  # no -m: the committed trained model
    if name and any(a in ("-h", "--help") for a in rest):
        print(CHAT_HELP if name == "chat" else SERVE_HELP + "; --queue 0 answers one request at a time, refusing "
              "the rest", "\nengine flags:", flush=True)  # then the engine's own --help
    cfg = parse_cli(rest)
    if name and cfg.session:
        raise UserError(f"bmoe {name}: --session is its own mode; drop it")
    return Command(name, cfg, sf)


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


def run(argv: list[str], env: Environment | None = None) -> int:
    """`bmoe ARGV` in this process, without the re-execution (tests and harness.engine.diag call it)."""
    env = env or Environment.read(os.environ)
    hub = _hub(argv)
    if isinstance(hub, int):
        return hub
    return execute(parse(hub, env), env)  # before the SIGINT handler: a refused flag touches nothing


def execute(cmd: Command, env: Environment) -> int:
    """The parsed command: its values alone, handed on (nothing below reads argv or the environment)."""
    import signal

    sub, cfg, serve_flags = cmd.sub, cmd.cfg, cmd.serve
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
    faults = Faults.from_env(env.test_faults)  # the correctness gates' fault injection; None in real use
    with _implementations(env):
        engine = open_engine(cfg, sys.stdout, use_c_filter=env.c_hook, wrap_reader=faults.wrap if faults else None)
        try:
            return _drive(sub, cfg, serve_flags, sock, items, engine, env, interrupt)
        finally:
            engine.close()


@contextmanager
def _implementations(env: Environment) -> Iterator[None]:
    """The Python read lanes or the policies' reference when the environment asks, for this run (an in-process
    caller gets its own back after)."""
    from harness.engine.cache.policies import native
    from harness.engine.io import clanes

    lanes, policies = clanes.use_python(env.python_lanes), native.use_reference(env.reference_policies)
    try:
        yield
    finally:
        clanes.use_python(lanes)
        native.use_reference(policies)


def _drive(sub, cfg, serve_flags, sock, items, engine, env: Environment, interrupt: _Interrupt) -> int:
    """The loaded engine through the mode asked for (--session, chat, serve, fidelity, prompts, one run)."""
    import signal

    from harness.engine.io import lazymap

    lazymap.watch_model_files(list(engine.layout.shards), EXIT_MODEL_CHANGED, compiled=env.compiled_watch)
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


def _reexec_with_shim(argv: list[str], cfg: EngineConfig) -> None:
    """Re-execute this command (`argv`: its arguments, -hf already pulled and given as -m; `cfg`: them parsed) once
    with the mmap shim preloaded (harness.engine.io.lazymap), so that the load reads only what is used; returns when
    that is not needed or not possible (the load then populates)."""
    from harness.engine.io import lazymap

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
    env = Environment.read(os.environ)  # the one read of the environment
    try:
        if argv is None:
            from harness.engine.io import lazymap

            lazymap.restore_preload_env(os.environ)
            hub = _hub(sys.argv[1:])  # before the re-execution: it runs the pulled file, and pulls nothing again
            if isinstance(hub, int):
                return hub
            cmd = parse(hub, env)  # the one parse of argv (a re-executed process parses its own)
            _reexec_with_shim(hub, cmd.cfg)
            return execute(cmd, env)
        return run(argv, env)
    except BmoeError as e:  # a user error (EXIT_USER), an engine failure (EXIT_ENGINE): the engine raises no other kind
        _err(str(e))
        return e.exit_code
    except KeyboardInterrupt:
        _err("interrupted")
        return 130
    except BrokenPipeError:
        return 1
    except Exception as e:  # a bug: still one line, and the engine failure's status
        if env.debug:
            raise
        _err(f"internal error: {type(e).__name__}: {e} (rerun with BMOE_DEBUG=1 for a traceback)")
        return EXIT_ENGINE


if __name__ == "__main__":
    sys.exit(main())
