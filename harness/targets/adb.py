"""An adb device as a campaign target: the `Target` protocol (harness.targets.base) on `harness.adb.Device`.

Files are staged under `device_dir` (/data/local/tmp/bmoe by default); runs happen in its runs/ dir, and
their outputs are pulled into the run's folder and then removed from the device. A device that goes
away mid-run is a failed RunOutcome with reason "device gone: ...", not an error.
"""

from __future__ import annotations

from pathlib import Path

from harness.adb import Device, DeviceGone
from harness.adb_parse import exit_reason
from harness.adb_shell import sh_join
from harness.errors import UserError
from harness.targets.base import LineCallback, RunOutcome

DEFAULT_DEVICE_DIR = "/data/local/tmp/bmoe"


class AdbTarget:
    """Runs engines on an adb device.

    serial: which device (else $ANDROID_SERIAL, else the only one ready); device_dir: where staged files
    and run outputs go on the device (default /data/local/tmp/bmoe; the Linux adbd in tests has a
    tmpfs there), both created now. adb server at host:port: one that does not answer is an error naming
    it, never replaced by a local one (harness.adb_client).
    """

    kind = "adb"

    def __init__(
        self,
        serial: str | None = None,
        *,
        device_dir: str = DEFAULT_DEVICE_DIR,
        host: str = "127.0.0.1",
        port: int = 5037,
    ):
        if not device_dir.startswith("/"):
            raise UserError(f"device_dir {device_dir!r}: must be an absolute path on the device")
        self.device_dir = device_dir.rstrip("/") or "/"
        self.device = Device(serial, host=host, port=port)
        self.stage_log: list[tuple[str, str]] = []  # (remote path, "pushed" | "unchanged")
        self.device.shell_ok(sh_join(["mkdir", "-p", self.device_dir, self.run_dir()]),
                             what="create the device dir")

    @property
    def serial(self) -> str:
        return self.device.serial

    def describe(self) -> dict:
        free = self.device.free_kib(self.device_dir)
        return {**self.device.describe(), "device_dir": self.device_dir,
                "device_dir_free_mib": round(free / 1024) if free is not None else None}

    def run_dir(self) -> str:
        return f"{self.device_dir}/runs"

    def stage(self, local: Path, kind: str) -> str:
        remote = f"{self.device_dir}/{Path(local).name}"
        self.stage_log.append((remote, self.device.push(Path(local), remote, kind, executable=kind == "engine")))
        return remote

    def sample_state(self) -> dict:
        return self.device.sample_state()

    def drop_caches(self) -> bool:
        return self.device.drop_caches()

    def reconnect(self) -> None:
        """After the device went away: UserError unless its server lists it ready again; then its device dir
        is made again (a rebooted phone may have lost it; staged files are pushed again by stage())."""
        self.device.ready()
        self.device.stop.clear()
        self.device.shell_ok(sh_join(["mkdir", "-p", self.device_dir, self.run_dir()]), what="create the device dir")

    def interrupt(self) -> None:
        """From another thread: end the run in progress as Ctrl-C would (the engine killed on the device, and
        run() raises KeyboardInterrupt in its own thread); later runs are refused the same way until reconnect()."""
        self.device.stop.set()

    def reap_orphans(self) -> list[str]:
        return self.device.reap_orphans()

    def close(self) -> None:
        self.device.reap_orphans()

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
        if not argv:
            raise UserError("engine command is empty")
        out_dir = Path(out_dir)
        out_dir.mkdir(parents=True, exist_ok=True)
        log_path = Path(log_path)
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(log_path, "w", encoding="utf-8") as log:
            sr = self.device.run(argv, cwd=self.run_dir(), timeout_s=timeout_s, log=log,
                                 on_stdout_line=on_stdout_line)
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
        device, so run files do not pile up on a phone. Relative paths are relative to run_dir()."""
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
            except DeviceGone as e:
                return fetched, missing, str(e)
            fetched[remote] = dest
        return fetched, missing, None
