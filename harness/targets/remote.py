"""What an adb target and an SSH target share (`RemoteTarget`): a run on a device reached through one
`RemoteShell` (harness.devices.remote), its outcome, and its outputs pulled into the run's folder (size-checked)
and then removed from the device's run dir, so run files do not pile up on a phone. A transport's target gives
`_run_on` (the process itself, as a `ShellRun`); the rest is here, once.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from pathlib import Path
from typing import TextIO

from harness.devices.parse import exit_reason
from harness.devices.remote import RemoteShell, ShellRun
from harness.devices.sh import sh_join
from harness.errors import UserError
from harness.targets.base import LineCallback, RunOutcome


class RemoteTarget(ABC):
    """A campaign target on a device reached through a remote shell (`device`)."""

    device: RemoteShell
    stage_log: list[tuple[str, str]]  # (remote path, "pushed" | "unchanged")

    @abstractmethod
    def run_dir(self) -> str: ...

    @abstractmethod
    def stage_dir(self) -> str:
        """Where staged files go on the device."""

    @abstractmethod
    def _run_on(self, argv: list[str], timeout_s: float, log: TextIO, on_line: LineCallback | None) -> ShellRun:
        """Run argv in run_dir() on the device, its output in log (leftovers of lost runs reaped first)."""

    @property
    def serial(self) -> str:
        return self.device.serial

    def sample_state(self) -> dict:
        return self.device.sample_state()

    def drop_caches(self) -> bool:
        return self.device.drop_caches()

    def reap_orphans(self) -> list[str]:
        return self.device.reap_orphans()

    def stage(self, local: Path, kind: str) -> str:
        remote = f"{self.stage_dir()}/{Path(local).name}"
        self.stage_log.append((remote, self.device.push(Path(local), remote, kind, executable=kind == "engine")))
        return remote

    def run(self, argv: list[str], *, timeout_s: float, outputs: list[str], out_dir: Path, log_path: Path,
            on_stdout_line: LineCallback | None = None) -> RunOutcome:
        if not argv:
            raise UserError("engine command is empty")
        out_dir = Path(out_dir)
        out_dir.mkdir(parents=True, exist_ok=True)
        log_path = Path(log_path)
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(log_path, "w", encoding="utf-8") as log:
            sr = self._run_on(argv, timeout_s, log, on_stdout_line)
        if sr.gone is not None:
            return RunOutcome(sr.exit_code, f"device gone: {sr.gone}", sr.wall_s, remote_pid=sr.pid)
        reason: str | None = None
        if sr.timed_out:
            reason = f"timeout after {timeout_s:g} s"
        elif sr.exit_code is not None and sr.exit_code != 0:
            reason = exit_reason(sr.exit_code, sr.stderr_tail)
        fetched, missing, pull_err = self._pull(outputs, out_dir)
        if reason is None and pull_err:
            reason = f"device gone: {pull_err}"
        elif reason is None and missing:
            reason = f"engine exited 0 but did not write {missing[0]}"
        return RunOutcome(sr.exit_code, reason, sr.wall_s, fetched, remote_pid=sr.pid)

    def _pull(self, outputs: list[str], out_dir: Path) -> tuple[dict[str, Path], list[str], str | None]:
        """Pull each output into out_dir (size-checked); outputs inside run_dir() are then deleted on the
        device. Relative paths are relative to run_dir()."""
        fetched: dict[str, Path] = {}
        missing: list[str] = []
        for remote in outputs:
            path = remote if remote.startswith("/") else f"{self.run_dir()}/{remote}"
            dest = out_dir / Path(path).name
            try:
                if not self.device.pull(path, dest):
                    missing.append(remote)
                    continue
                if path.startswith(self.run_dir() + "/"):
                    self.device.shell(sh_join(["rm", "-f", path]))
            except self.device.gone as e:
                return fetched, missing, str(e)
            fetched[remote] = dest
        return fetched, missing, None
