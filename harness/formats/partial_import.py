"""The part of a third-party package that is needed, without the rest: `submodule_alone("pkg.sub")` imports pkg.sub
without running pkg/__init__.py first when pkg is not imported yet. pkg goes into sys.modules uninitialised, with a
module `__getattr__` (PEP 562) that runs its __init__ the first time anyone asks it for a name it does not have, so
`import pkg; pkg.X` and `from pkg import X` elsewhere in the process still work.

Why: a streamed engine holds every module it imported for its whole run, under a memory cap. gguf's __init__ imports
its writer, tensor mapping, vocab and metadata (yaml) for the header constants the engine needs (3.7 MiB of anonymous
memory against 0.6); llama-cpp-python's imports its high-level Llama class, jinja2, diskcache and sqlite3 for the
ctypes bindings (5.8 MiB against 1.3; bench-data/2026-12-03-mincap/imports-partial.jsonl)."""

from __future__ import annotations

import importlib
import importlib.util
import sys
from types import ModuleType


def submodule_alone(name: str) -> ModuleType:
    if name in sys.modules:
        return sys.modules[name]
    parent = name.rpartition(".")[0]
    if parent and parent not in sys.modules:
        spec = importlib.util.find_spec(parent)
        if spec is not None and spec.loader is not None and spec.submodule_search_locations is not None:
            pkg = importlib.util.module_from_spec(spec)
            loader = spec.loader

            def finish(attr: str) -> object:
                pkg.__dict__.pop("__getattr__", None)
                loader.exec_module(pkg)
                try:
                    return pkg.__dict__[attr]
                except KeyError:
                    raise AttributeError(f"module {parent!r} has no attribute {attr!r}") from None

            pkg.__getattr__ = finish  # type: ignore[attr-defined]
            sys.modules[parent] = pkg
    return importlib.import_module(name)
