"""What the fault tests share: a finished campaign folder (one per module) and a fresh copy of it per test, to break."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers.faults import copy_of, done_campaign


@pytest.fixture(scope="module")
def done_folder(tmp_path_factory) -> Path:
    return done_campaign(tmp_path_factory.mktemp("done"))


@pytest.fixture
def copy(done_folder, tmp_path) -> Path:
    return copy_of(done_folder, tmp_path)
