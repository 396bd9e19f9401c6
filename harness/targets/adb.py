"""An adb device as a campaign target: the `Target` protocol (harness.targets.base) on `harness.devices.adb.Device`,
a `RemoteTarget` (harness.targets.remote: the run's outcome and its outputs' pull, shared with SSH).

Files are staged under `device_dir` (/data/local/tmp/bmoe by default); runs happen in its runs/ dir, and
their outputs are pulled into the run's folder and then removed from the device. A device that goes
away mid-run is a failed RunOutcome with reason "device gone: ...", not an error.
"""

from __future__ import annotations

from typing import TextIO

from harness.devices.adb import Device
from harness.devices.remote import ShellRun
from harness.devices.sh import sh_join
from harness.errors import UserError
from harness.targets.base import LineCallback
from harness.targets.remote import RemoteTarget

DEFAULT_DEVICE_DIR = "/data/local/tmp/bmoe"


class AdbTarget(RemoteTarget):
    """Runs engines on an adb device.

    serial: which device (else $ANDROID_SERIAL, else the only one ready); device_dir: where staged files
    and run outputs go on the device (default /data/local/tmp/bmoe; the Linux adbd in tests has a
    tmpfs there), both created now. adb server at host:port: one that does not answer is an error naming
    it, never replaced by a local one (harness.devices.adb_client).
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
        self.argv_prefix: list[str] = []  # put in front of each run's command line (`taskset MASK`: prepare.pin_cores)
        self.device.shell_ok(sh_join(["mkdir", "-p", self.device_dir, self.run_dir()]),
                             what="create the device dir")

    def describe(self) -> dict:
        free = self.device.free_kib(self.device_dir)
        return {**self.device.describe(), "device_dir": self.device_dir,
                "device_dir_free_mib": round(free / 1024) if free is not None else None}

    def run_dir(self) -> str:
        return f"{self.device_dir}/runs"

    def stage_dir(self) -> str:
        return self.device_dir

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

    def close(self) -> None:
        self.device.reap_orphans()

    def _run_on(self, argv: list[str], timeout_s: float, log: TextIO, on_line: LineCallback | None) -> ShellRun:
        return self.device.run(argv, cwd=self.run_dir(), timeout_s=timeout_s, log=log, on_stdout_line=on_line)
