"""The engine's one wiring order, held where it can be held statically (issue 37 item 3): every error the engine
raises to `bmoe` is a `BmoeError` (the CLI turns anything else into an internal error, exit 3), the environment
is read in cli.py only, argv is parsed there once, and the streaming parts (reader, cache, hook) are built by the
composition root before the `Session`, which is handed them and builds none (harness.engine.compose's order)."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

from harness.errors import BmoeError

REPO = Path(__file__).resolve().parents[2]
ENGINE = REPO / "harness" / "engine"

# exception classes of the engine that never reach the CLI, and why
INTERNAL = {
    "harness.engine.model.gguf_layout._Truncated": "caught in load_layout, which raises a UserError naming the file",
    "harness.engine.serve.tokenize.Stopped": "a request stopped while tokenizing: caught by the protocol, the server",
    "harness.engine.io.faults.InjectedFault": "the gates' fault, raised in the eval callback: the hook's HookError",
}


def _engine_files() -> list[Path]:
    return sorted(p for p in ENGINE.rglob("*.py") if "__pycache__" not in p.parts)


def _module(p: Path) -> str:
    parts = list(p.relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _exception_classes() -> dict[str, type]:
    """Every class defined in the engine that is an exception, by dotted name (its module imported)."""
    out = {}
    for p in _engine_files():
        tree = ast.parse(p.read_text())
        names = [n.name for n in tree.body if isinstance(n, ast.ClassDef)
                 and any(isinstance(b, ast.Name) and (b.id.endswith(("Error", "Exception", "Fault", "Failed"))
                                                      or b.id in ("Exception", "_Truncated"))
                         or isinstance(b, ast.Attribute) for b in n.bases)]
        if names:
            mod = importlib.import_module(_module(p))
            for n in names:
                c = getattr(mod, n)
                if isinstance(c, type) and issubclass(c, BaseException):
                    out[f"{mod.__name__}.{n}"] = c
    return out


def test_every_engine_error_is_a_bmoe_error():
    classes = _exception_classes()
    assert {"harness.engine.run.llama_model.EngineError", "harness.engine.stream.common.HookError"} <= set(classes)
    bad = [f"{name}: {' -> '.join(c.__name__ for c in cls.__mro__)}" for name, cls in classes.items()
           if not issubclass(cls, BmoeError) and name not in INTERNAL]
    assert not bad, "engine exceptions outside BmoeError (the CLI would call them internal errors):\n  " + \
        "\n  ".join(bad)


def test_every_raise_of_an_engine_class_is_a_bmoe_error():
    """`raise X(...)` anywhere in the engine, X a class the engine defines: X is a BmoeError (or internal, above)."""
    classes = _exception_classes()
    short = {name.rsplit(".", 1)[1]: (name, cls) for name, cls in classes.items()}
    bad = []
    for p in _engine_files():
        for node in ast.walk(ast.parse(p.read_text())):
            if not isinstance(node, ast.Raise) or node.exc is None:
                continue
            exc = node.exc.func if isinstance(node.exc, ast.Call) else node.exc
            if isinstance(exc, ast.Name) and exc.id in short:
                name, cls = short[exc.id]
                if not issubclass(cls, BmoeError) and name not in INTERNAL:
                    bad.append(f"{p.relative_to(REPO)}:{node.lineno}: raise {exc.id}")
    assert not bad, "\n".join(bad)


def test_the_engine_failures_keep_exit_3_and_their_runtime_error_base():
    from harness.engine import cli
    from harness.engine.run.session import EngineError
    from harness.engine.stream.common import HookError

    for cls in (EngineError, HookError):
        assert issubclass(cls, BmoeError) and issubclass(cls, RuntimeError) and cls.exit_code == cli.EXIT_ENGINE == 3


def test_device_gone_is_a_bmoe_error():
    from harness.devices.adb import DeviceGone

    assert issubclass(DeviceGone, BmoeError) and DeviceGone.exit_code == 1


@pytest.mark.parametrize("exc, code, line", [
    ("user", 2, "bmoe: error: a bad flag\n"),
    ("engine", 3, "bmoe: error: llama.cpp could not load x\n"),
    ("hook", 3, "bmoe: error: streaming hook failed: OSError: EIO\n"),
    ("other", 3, "bmoe: error: internal error: ValueError: a bug (rerun with BMOE_DEBUG=1 for a traceback)\n"),
])
def test_the_cli_turns_every_error_into_one_line(monkeypatch, capsys, exc, code, line):
    from harness.engine import cli
    from harness.engine.run.session import EngineError
    from harness.engine.stream.common import HookError
    from harness.errors import UserError

    err = {"user": UserError("a bad flag"), "engine": EngineError("llama.cpp could not load x"),
           "hook": HookError("streaming hook failed: OSError: EIO"), "other": ValueError("a bug")}[exc]

    def boom(argv, env=None):
        raise err

    monkeypatch.setattr(cli, "run", boom)
    monkeypatch.delenv("BMOE_DEBUG", raising=False)
    assert cli.main(["-m", "x.gguf"]) == code
    assert capsys.readouterr().err == line


def test_the_environment_is_read_in_cli_only():
    """No engine module but cli.py reads os.environ or os.getenv; io/lazymap.py writes the file ids the preloaded C
    shim reads during the load (its channel, no setting)."""
    bad = []
    for p in _engine_files():
        rel = p.relative_to(REPO).as_posix()
        if rel == "harness/engine/cli.py":
            continue
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "os" \
                    and node.attr in ("environ", "getenv", "getenvb", "environb"):
                if rel == "harness/engine/io/lazymap.py" and _writes_files_env(p, node.lineno):
                    continue
                bad.append(f"{rel}:{node.lineno}: os.{node.attr}")
    assert not bad, "the environment read outside harness/engine/cli.py:\n  " + "\n  ".join(bad)


def _writes_files_env(p: Path, line: int) -> bool:
    return "FILES_ENV" in p.read_text().splitlines()[line - 1]


def test_the_environment_is_read_once_into_values():
    from harness.engine.cli import Environment

    assert Environment.read({}) == Environment()
    e = Environment.read({"BMOE_PURE_PYTHON_LANES": "1", "BMOE_PURE_PYTHON_POLICIES": "1", "BMOE_HOOK": "python",
                          "BMOE_MODEL_WATCH": "thread", "BMOE_DEBUG": "1", "BMOE_API_KEY": "k",
                          "BMOE_TEST_FAIL_AT_LAYER": "2"})
    assert (e.python_lanes, e.reference_policies, e.c_hook, e.compiled_watch, e.debug, e.api_key) == \
        (True, True, False, False, True, "k")
    assert dict(e.test_faults) == {"BMOE_TEST_FAIL_AT_LAYER": "2"}
    assert not Environment.read({"BMOE_PURE_PYTHON_LANES": "0", "BMOE_PURE_PYTHON_POLICIES": "0"}).python_lanes


def test_an_in_process_run_gives_the_implementations_back():
    from harness.engine.cache.policies import native
    from harness.engine.cli import Environment, _implementations
    from harness.engine.io import clanes

    with _implementations(Environment(python_lanes=True, reference_policies=True)):
        assert clanes.load() is None and native.helper() is None
    assert not clanes._python and not native._reference


def _calls(p: Path) -> list[tuple[str, int]]:
    """(name, line) of every call `name(...)` or `x.name(...)` in a file."""
    out = []
    for node in ast.walk(ast.parse(p.read_text())):
        if isinstance(node, ast.Call):
            f = node.func
            name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""
            out.append((name, node.lineno))
    return out


def test_argv_is_parsed_once_in_the_cli():
    """The command line is parsed by cli.parse alone: it calls config's parse_cli (the engine's declared flags) and
    parses serve's flags itself; no other engine module parses one (diag's tools and the registry's and config's
    `python -m` helpers have their own, and nothing imports them)."""
    own = {"cli.py", "rules.py", "registry.py", "__main__.py"}
    bad = [f"{p.relative_to(REPO)}:{line}: {name}()" for p in _engine_files()
           if p.name not in own and p.parent.name != "diag"
           for name, line in _calls(p) if name in ("parse_cli", "parse_known_args", "parse_args")]
    bad += [f"{p.relative_to(REPO)}:{line}: parse_cli()" for p in _engine_files() if p.name != "cli.py"
            for name, line in _calls(p) if name == "parse_cli" and p.parent.name != "diag"]
    assert not bad, "argv parsed outside harness/engine/cli.py:\n  " + "\n  ".join(bad)
    for sub in ("run", "serve", "stream", "cache", "io", "routing", "guess"):
        for p in sorted((ENGINE / sub).rglob("*.py")):
            text = p.read_text()
            assert "import argparse" not in text and "sys.argv" not in text, f"{p.relative_to(REPO)} reads argv"


def test_the_streaming_parts_are_built_by_the_composition_root_only():
    """The reader, the cache and the hook are constructed in compose.py (the dense weights' own reader in
    io/dense.py); nothing under run/ builds one, and the session is handed them."""
    where = {"ExpertCache": {"compose.py"}, "StreamHook": {"compose.py"}, "SliceReader": {"compose.py", "dense.py"},
             "LoadedModel": {"compose.py"}, "Session": {"compose.py"}}
    bad = [f"{p.relative_to(REPO)}:{line}: {name}(...)" for p in _engine_files()
           for name, line in _calls(p) if name in where and p.name not in where[name]]
    assert not bad, "\n".join(bad)


def test_the_session_is_handed_the_loaded_model_and_the_parts():
    import inspect

    from harness.engine.run.session import Session

    assert list(inspect.signature(Session.__init__).parameters) == ["self", "loaded", "parts"]
    tree = ast.parse((ENGINE / "run" / "session.py").read_text())
    own = {t.attr for n in ast.walk(tree) if isinstance(n, ast.Assign) for t in n.targets
           if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self"}
    assert not own & {"hook", "dense", "reader", "cache"}, "the session keeps a part of its own"


def test_the_hook_and_the_dense_weights_have_one_owner():
    """No module reads a part through the session (`sess.hook`, `session.dense`): `parts` is their one owner."""
    bad = []
    for p in sorted((REPO / "harness").rglob("*.py")) + sorted((REPO / "scripts").glob("*.py")):
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, ast.Attribute) and node.attr in ("hook", "dense", "reader", "cache"):
                v = node.value
                name = v.id if isinstance(v, ast.Name) else v.attr if isinstance(v, ast.Attribute) else ""
                if name in ("sess", "session"):
                    bad.append(f"{p.relative_to(REPO)}:{node.lineno}: {name}.{node.attr}")
    assert not bad, "\n".join(bad)


def test_the_order_is_declared_in_compose():
    from harness.engine import compose

    doc = compose.__doc__ or ""
    steps = ["LoadedModel", "_stream_parts", "`Session`", "`Engine`"]
    assert all(s in doc for s in steps) and [doc.index(s) for s in steps] == sorted(doc.index(s) for s in steps)
    src = (ENGINE / "compose.py").read_text()
    body = src[src.index("def open_engine"):]
    calls = [body.index(c) for c in ("LoadedModel(cfg, layout)", "_stream_parts(cfg", "Session(loaded, parts)",
                                     "Engine(cfg, layout, k, session)")]
    assert calls == sorted(calls)
