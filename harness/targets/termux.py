"""A phone's Termux as an SSH target (`target: {kind: termux, serial: ...}`): an adb forward from a free local
port to Termux's sshd on the phone (port 8022 unless `port:` says otherwise), then SSH to 127.0.0.1 on that
port (harness.targets.ssh). The forward is made through the adb server (adbutils), reused when one to the
same phone port exists, and removed at close when this process made it."""

from __future__ import annotations

import re

from harness.devices.adb import ADB_ERRORS, Device
from harness.devices.parse import one_line
from harness.devices.ssh import SshAddress, expand
from harness.errors import UserError

TERMUX_SSHD_PORT = 8022


class TermuxForward:
    def __init__(self, serial: str | None, phone_port: int | None = None):
        self.dev = Device(serial)  # UserError when adb has no such device, or several and no serial
        self.phone_port = phone_port or TERMUX_SSHD_PORT
        remote = f"tcp:{self.phone_port}"
        try:
            before = {f.local for f in self.dev._dev.forward_list() if f.remote == remote}
            self.local_port = self.dev._dev.forward_port(self.phone_port)
        except ADB_ERRORS as e:
            raise UserError(f"termux target {self.dev.serial}: adb forward to port {self.phone_port} failed: "
                            f"{one_line(e)}") from e
        self.made = f"tcp:{self.local_port}" not in before
        self.label = f"termux on {self.dev.serial} (adb forward tcp:{self.local_port} -> tcp:{self.phone_port})"

    def address(self, user: str | None, identity_file: str | None, known_hosts: str | None) -> SshAddress:
        alias = "termux-" + re.sub(r"[^A-Za-z0-9.-]", "-", self.dev.serial)  # its key is the phone's, any port
        return SshAddress(host="127.0.0.1", port=self.local_port, user=user, identity_file=expand(identity_file),
                          known_hosts=expand(known_hosts), host_key_alias=alias)

    def close(self) -> None:
        if self.made:
            try:
                self.dev._dev.forward_remove(f"tcp:{self.local_port}", raise_non_found=False)
            except ADB_ERRORS:
                pass  # the phone or the adb server is gone: so is the forward
