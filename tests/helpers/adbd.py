"""The loopback adbd the adb tests run against: tests/adbd/run-adb-tests.sh starts it in a private network namespace
and exports its serial; without it, tests/conftest.py skips every test marked `adb`, with WHY_NOT as the reason."""

from __future__ import annotations

import os

SERIAL = os.environ.get("BMOE_ADB_TEST_SERIAL")
WHY_NOT = "needs the loopback adbd: run tests/adbd/run-adb-tests.sh"
