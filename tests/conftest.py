"""What every test folder shares. The markers are declared in pyproject.toml: `engine` (needs the built
llama-cpp-python engine; deselect with -m "not engine"), `adb` (needs the loopback adbd, which
tests/adbd/run-adb-tests.sh provides) and `ssh` (needs the loopback sshd, tests/helpers/sshd.py, inside that same
namespace): a test marked `adb` or `ssh` is skipped, with the reason, when its daemon cannot be there.
Shared code lives in tests/helpers/ and fixtures in a folder's conftest.py; no test module imports another
(tests/engine/test_structure.py checks it)."""

from __future__ import annotations

import signal
from collections.abc import Iterator

import pytest

from tests.helpers import sshd
from tests.helpers.adbd import SERIAL, WHY_NOT


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    skips = {"adb": WHY_NOT if SERIAL is None else None, "ssh": sshd.WHY_NOT}
    for item in items:
        for marker, why in skips.items():
            if why is not None and item.get_closest_marker(marker) is not None:
                item.add_marker(pytest.mark.skip(reason=why))


@pytest.fixture(autouse=True)
def _signal_handlers_put_back() -> Iterator[None]:
    """A test that runs a command's `main` in this process gets that command's SIGINT handler (the engine's CLI
    installs one for as long as the process lives): put SIGINT and SIGTERM back after each test, so a later test,
    and a Ctrl-C to the whole suite, meet the disposition the suite started with."""
    saved = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    yield
    for sig, handler in saved.items():
        if handler is not None and signal.getsignal(sig) is not handler:
            signal.signal(sig, handler)
