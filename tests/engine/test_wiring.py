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
    assert "harness.engine.run.session.EngineError" in classes and "harness.engine.stream.common.HookError" in classes
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
    from harness.adb import DeviceGone

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

    def boom(argv):
        raise err

    monkeypatch.setattr(cli, "run", boom)
    monkeypatch.delenv("BMOE_DEBUG", raising=False)
    assert cli.main(["-m", "x.gguf"]) == code
    assert capsys.readouterr().err == line
