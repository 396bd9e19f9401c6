"""What the campaign runner needs from a place that runs engines: the `Target` protocol and the
`RunOutcome` of one run. Implementations: `LocalTarget` (a subprocess here, optionally under a cgroup
memory cap), `AdbTarget` (an Android device, or any adbd, over adbutils) and `SshTarget` (a machine over
SSH, or a phone's Termux through an adb forward: harness.targets.ssh).

Contract for callers (the runner):
- `stage(path, kind)` once per file before the runs; it returns the path to put in argv.
- `run(argv, ...)` never raises for a failed run: an engine error, a timeout, an OOM kill under the cap
  or a device that went away all come back as a `RunOutcome` whose `reason` is one line. It raises
  `UserError` only for a mistake in what it was given (and re-raises KeyboardInterrupt after killing
  the engine, so Ctrl-C leaves nothing running).
- `outcome.ok` is the single test of success: exit code 0, no reason.
- `outputs` are paths on the target (adb: relative ones are relative to run_dir()). Each lands in out_dir
  under its basename; `fetched` maps the path as given to the local file. A missing output after exit 0
  fails the run ("engine exited 0 but did not write <path>"). adb: outputs inside run_dir() are removed
  from the device once pulled and size-checked.
- `log_path` gets stdout and stderr lines as they arrive (interleaved); `on_stdout_line` gets stdout lines
  without their newline, from a reader thread (local) or the calling thread (adb). An exception raised
  by the callback is re-raised after the run has finished and been cleaned up.
- LocalTarget(drop_caches=True) drops the page cache itself before each run; callers need not call
  drop_caches() too. A memory cap gives `peak_mem_mib` (the cgroup's peak, page cache included) and
  `oom_killed`.
- `sample_state()` may be called from another thread while run() is in progress. On adb, if the device
  has gone away, the sample has no readings and an "error" key, rather than raising.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol, runtime_checkable

from harness.devices.parse import last_line

LineCallback = Callable[[str], None]


@dataclass
class RunOutcome:
    """The result of one engine process on a target."""

    exit_code: int | None  # None if it never started, or was killed (timeout, OOM, device gone)
    reason: str | None  # None on success, else one line: why the run failed
    wall_s: float  # from start of the process to its end, measured on the host
    fetched: dict[str, Path] = field(default_factory=dict)  # output path on the target -> local file
    peak_mem_mib: float | None = None  # peak of the memory-cap cgroup (page cache included), if capped
    oom_killed: bool = False  # the kernel's OOM killer acted inside the cap during this run
    remote_pid: int | None = None  # adb: the engine's PID on the device (for the record)

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and self.reason is None


@runtime_checkable
class Target(Protocol):
    kind: str  # "local" | "adb" | "ssh" (termux too)

    def describe(self) -> dict:
        """Host or device description for the manifest (JSON-serialisable)."""
        ...

    def stage(self, local: Path, kind: str) -> str:
        """Make a local file (kind "engine" or "model", or any label) available on the target and
        return its path there. adb: pushed under the device dir, skipped when size and sha256 match."""
        ...

    def run(
        self,
        argv: list[str],
        *,
        timeout_s: float,
        outputs: list[str],
        out_dir: Path,
        log_path: Path,
        on_stdout_line: LineCallback | None = None,
    ) -> RunOutcome:
        """Run argv on the target, stream its stdout lines to on_stdout_line, write stdout+stderr to
        log_path, then fetch `outputs` (paths on the target) into out_dir."""
        ...

    def run_dir(self) -> str:
        """A writable directory on the target for run outputs."""
        ...

    def sample_state(self) -> dict:
        """One device-state sample (harness.devices.state.build_sample's shape); cheap."""
        ...

    def drop_caches(self) -> bool:
        """Drop the page cache if possible (local root only); False when not possible."""
        ...

    def close(self) -> None: ...


def exit_reason(code: int, stderr_tail: str) -> str:
    """The one-line reason for a non-zero exit: "engine exited 3: <last stderr line>"; negative codes
    (Popen's killed-by-signal convention) are named by signal. A signal sent from outside (KILL, TERM,
    INT, HUP) says nothing of what the engine last printed, so no stderr line is added then."""
    import signal

    if code < 0:
        try:
            sig = signal.Signals(-code)
            name = sig.name
        except ValueError:
            sig, name = None, f"signal {-code}"
        head = f"engine killed by {name}"
        if sig in (signal.SIGKILL, signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            return head
        if sig is signal.SIGBUS:
            head += " (a mapped file, such as the model, was truncated or its storage failed)"
    else:
        head = f"engine exited {code}"
    tail = last_line(stderr_tail)
    return f"{head}: {tail}" if tail else head
