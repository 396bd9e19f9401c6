"""A traced campaign's per-run files: the engine writes its io_trace and compute_trace on the target, the runner
takes them into the run's folder under their fixed names (harness.formats.traces), where the manifest hashes
them with the run's other raw files."""

from __future__ import annotations

from pathlib import Path

from harness.errors import UserError
from harness.formats.folder import COMPUTE_TRACE_FILE, IO_TRACE_FILE
from harness.formats.traces import read_compute_trace, read_io_trace


def trace_outputs(run_dir: str, run_id: str) -> dict[str, str]:
    """The engine_argv_tail keywords: where the engine writes the two traces on the target."""
    base = f"{run_dir.rstrip('/')}/{run_id}"
    return {"io_trace": f"{base}.{IO_TRACE_FILE}", "compute_trace": f"{base}.{COMPUTE_TRACE_FILE}"}


def take_traces(fetched: dict[str, Path], traces: dict[str, str], tmp: Path) -> str | None:
    """Move the fetched traces into the run folder; the run's failure reason if one is missing or unreadable."""
    for key, name, read in (("io_trace", IO_TRACE_FILE, read_io_trace), ("compute_trace", COMPUTE_TRACE_FILE,
                                                                   read_compute_trace)):
        if key not in traces:
            continue
        got = fetched.get(traces[key])
        if got is None:
            return f"engine exited 0 but wrote no {name}"
        dest = tmp / name
        if Path(got) != dest:
            Path(got).replace(dest)
        try:
            read(dest)
        except UserError as e:
            return f"engine exited 0 but its {name} is unreadable: {e}"
    return None
