"""The policies' compiled helper (harness/engine/native/_policyc, built from policyc*.c by setup.py when a
compiler was there), or None: then the numpy and pure-Python reference runs. Both take the same
decisions (tests/engine/test_cache_decisions.py and tests/engine/test_policy_impls.py run both).
`use_reference(True)` forces the reference (the CLI sets it from BMOE_PURE_PYTHON_POLICIES=1, a test directly); a
policy reads the choice once, when the cache binds it."""

from __future__ import annotations

from types import ModuleType

from harness.engine.cache.policies.heaps import LayerHeaps, LazyMinHeap

try:
    from harness.engine.native import _policyc as _compiled
except ImportError:  # not built: the reference
    _compiled = None

_reference = False


def use_reference(on: bool) -> bool:
    """Force the numpy and pure-Python reference (on), or let the compiled helper be used (off, the default).
    Returns the setting it replaced."""
    global _reference
    old, _reference = _reference, on
    return old


def helper() -> ModuleType | None:
    """The compiled helper, unless it was not built or the reference is forced (`use_reference`)."""
    if _reference:
        return None
    return _compiled


def implementation() -> str:
    """`compiled` or `numpy`: which one a policy bound now would use."""
    return "numpy" if helper() is None else "compiled"


def layer_heaps(n_layer: int) -> LayerHeaps:
    """A LayerHeaps of `n_layer` layers: the compiled one (the same victims) unless `helper()` is None."""
    c = helper()
    return LayerHeaps(n_layer) if c is None else c.LayerHeaps(n_layer)


def min_heap() -> LazyMinHeap:
    """A LazyMinHeap of (layer, expert) keys: the compiled one (the same peeks) unless `helper()` is None."""
    c = helper()
    return LazyMinHeap() if c is None else c.MinHeap()
