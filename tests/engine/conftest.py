"""What the engine tests share: `impl`, each test run on both read-lane implementations, the Python lanes
(harness.engine.io.lanes) and the compiled ones (harness.engine.io.clanes), chosen as the engine chooses them, by
clanes.use_python (which the CLI sets from BMOE_PURE_PYTHON_LANES). A test that parametrizes `impl` itself
(test_policy_impls.py, test_cache_decisions.py) gets its own values, not this fixture."""

from __future__ import annotations

import pytest

from harness.engine.io import clanes


@pytest.fixture(params=["python", "c"])
def impl(request, monkeypatch):
    """Both lane implementations: the Python lanes and the compiled ones (harness.engine.io.clanes)."""
    monkeypatch.setattr(clanes, "_python", request.param == "python")
    if request.param == "c" and clanes.load() is None:
        pytest.fail("the compiled read lanes (_clanes*.so) are not built")
    return request.param
