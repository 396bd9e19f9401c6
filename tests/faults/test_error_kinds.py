"""The error kinds (harness.errors): each a type of its own with its exit code, all caught once by each CLI."""

from __future__ import annotations

import pytest

from harness import bench_cli
from harness.campaigns.store import FolderBusy
from harness.errors import BmoeError, Interrupted, ResourceError, RunFailed, TraceFormatError, UserError
from harness.formats import route_trace, traces
from harness.formats.files import DiskFull


def test_one_type_per_kind() -> None:
    kinds = (UserError, ResourceError, Interrupted, RunFailed)
    for a in kinds:
        assert issubclass(a, BmoeError)
        assert not any(issubclass(a, b) for b in kinds if b is not a)
    assert issubclass(DiskFull, ResourceError) and issubclass(FolderBusy, ResourceError)
    assert traces.TraceFormatError is route_trace.TraceFormatError is TraceFormatError


@pytest.mark.parametrize(("error", "code"), [(UserError, 2), (DiskFull, 28), (FolderBusy, 75), (Interrupted, 130),
                                             (RunFailed, 1)])
def test_bench_cli_one_line_and_its_code(error: type[BmoeError], code: int, monkeypatch: pytest.MonkeyPatch,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    def app(**_: object) -> None:
        raise error("x.yaml: what went wrong; what to do")

    monkeypatch.setattr(bench_cli, "app", app)
    assert bench_cli.main([]) == code
    assert capsys.readouterr().err == "Error: x.yaml: what went wrong; what to do\n"
