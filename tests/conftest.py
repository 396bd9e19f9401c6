"""What every test folder shares. The markers are declared in pyproject.toml: `engine` (needs the built
llama-cpp-python engine; deselect with -m "not engine") and `adb` (needs the loopback adbd, which
tests/adbd/run-adb-tests.sh provides): a test marked `adb` is skipped, with the reason, when the adbd is not there.
Shared code lives in tests/helpers/ and fixtures in a folder's conftest.py; no test module imports another
(tests/engine/test_structure.py checks it)."""

from __future__ import annotations

import pytest

from tests.helpers.adbd import SERIAL, WHY_NOT


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if SERIAL is not None:
        return
    skip = pytest.mark.skip(reason=WHY_NOT)
    for item in items:
        if item.get_closest_marker("adb") is not None:
            item.add_marker(skip)
