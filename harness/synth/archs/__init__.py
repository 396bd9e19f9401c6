"""Synthetic layouts of the architectures that have a module of their own here, exactly what llama.cpp's loader
for that arch creates. Each module, found by name (`harness.synth.archs.<arch>`, '-' spelled '_'), defines ARCH
(the general.architecture value), SPEC_DEFAULTS (ModelSpec fields for the tiny model), validate(spec) (refuses
what the arch cannot load, as a UserError), tensors(spec) (every tensor, in file order) and kvs(spec, base) (the
file's keys; `base` holds the common ones, plan.py's); optionally SHAPES (named real shapes for make-model
--shape) and the defaults of its knobs: OPTS (ModelSpec.arch_opts, read with `opts`) or PARAMS (the integer
ModelSpec.arch_params, read with `param`). Modules whose name starts with '_' hold what several archs share."""

from __future__ import annotations

import importlib
import importlib.util
import pkgutil
from types import ModuleType
from typing import Any


def _module_name(arch: str) -> str:
    return f"{__name__}.{arch.replace('-', '_')}"


def find(arch: str) -> ModuleType | None:
    """The layout module of `arch`, or None when the arch has none (then archs/_generic.py lays it out)."""
    if not arch or not arch.replace("-", "_").isidentifier():
        return None
    name = _module_name(arch)
    if importlib.util.find_spec(name) is None:
        return None
    mod = importlib.import_module(name)
    return mod if getattr(mod, "ARCH", None) == arch and hasattr(mod, "SPEC_DEFAULTS") else None


def names() -> tuple[str, ...]:
    """Every arch with a layout module here, sorted."""
    out = []
    for m in pkgutil.iter_modules(__path__):
        if not m.name.startswith("_"):
            arch = getattr(importlib.import_module(f"{__name__}.{m.name}"), "ARCH", None)
            if arch and find(arch) is not None:
                out.append(arch)
    return tuple(sorted(out))


def shapes() -> dict[str, dict[str, Any]]:
    """Named real shapes (`make-model --shape`) the modules define in their SHAPES, each naming its arch."""
    out: dict[str, dict[str, Any]] = {}
    for arch in names():
        mod = find(arch)
        for name, fields in getattr(mod, "SHAPES", {}).items():
            out[name] = {"arch": arch, **fields}
    return out


def opts(spec: Any, defaults: dict[str, Any]) -> dict[str, Any]:
    """The module's OPTS with the spec's arch_opts over them; an unknown option is a programming error."""
    given = dict(spec.arch_opts)
    unknown = set(given) - set(defaults)
    if unknown:
        raise ValueError(f"{spec.arch}: unknown arch_opts {sorted(unknown)}; known: {sorted(defaults)}")
    return {**defaults, **given}


def param(spec: Any, defaults: dict[str, int], name: str) -> int:
    """The integer knob `name`: the spec's arch_params value, else the module's PARAMS default."""
    return spec.param(name, defaults[name])
