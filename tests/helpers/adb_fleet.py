"""A lab on loopback for the fleet tests, inside tests/adbd/run-adb-tests.sh's private network namespace:
real adbd devices, each in its own mount namespace with its own /data (devices do not share storage, as
phones do not), and real adb servers (`adb -a -P PORT server nodaemon`, the adbutils wheel's adb), each
device connected to one server. A test kills and restarts devices and servers as a lab loses them. A device may
have a device profile (thermal zones, cpufreq, dumpsys: tests/helpers/device_profile.py).

Also the engine those devices run: a POSIX sh script writing a bmoe_metrics v2 CSV (--ms: per-token ms,
--sleep: seconds per token of real time, so a device can be lost mid-run)."""

from __future__ import annotations

import os
import socket
import subprocess
import time
from pathlib import Path

from tests.helpers import sh_engine

# a progress line per token, each after --sleep seconds, before the CSV: a device lost mid-run leaves none
_SLOW_PROGRESS = r"""i=0
while [ "$i" -lt "$n" ]; do
  i=$((i + 1)); sleep "$pause"; echo "BMOE_PROGRESS {\"step\": $i, \"steps\": $n, \"wall_ms\": $ms}"
done
"""
ENGINE = sh_engine.sh_engine('n=4; ms=100; csv=""; m=""; pause=0.3',
                             ('--ms) ms="$2"; shift 2;;', '--sleep) pause="$2"; shift 2;;'), _SLOW_PROGRESS)

# each device: its own mount namespace and a private tmpfs on /data (the engine's files live there)
_DEVICE = ('mount -t tmpfs -o size=128m,mode=0755 bmoe-fleet-data /data && mkdir -p /data/local/tmp && '
           'chmod 1777 /data/local/tmp && exec "$0"')


def only_loopback() -> bool:
    links = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True, check=True).stdout
    return {ln.split(":")[1].strip().split("@")[0] for ln in links.splitlines() if ":" in ln} == {"lo"}


def wait_port(port: int, up: bool = True, timeout: float = 20.0) -> None:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            if up:
                return
        except OSError:
            if not up:
                return
        time.sleep(0.05)
    raise TimeoutError(f"port {port} did not {'open' if up else 'close'} in {timeout:g} s")


def listening(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
        return True
    except OSError:
        return False


class Lab:
    """Devices (adbd on 127.0.0.1:<port>) and servers (adb on 127.0.0.1:<port>) this test owns."""

    def __init__(self):
        self.adb = os.environ["BMOE_TEST_ADB"]
        self.adbd = os.environ["BMOE_TEST_ADBD"]
        assert only_loopback(), "refusing to start adbd: this network namespace has interfaces other than lo"
        self.devices: dict[int, subprocess.Popen] = {}
        self.servers: dict[int, subprocess.Popen] = {}
        self.attached: dict[int, int] = {}  # device port -> server port
        self.profiles: dict[int, Path] = {}  # device port -> its profile (tests/helpers/device_profile.py)

    def start_server(self, port: int) -> None:
        self.servers[port] = subprocess.Popen([self.adb, "-a", "-P", str(port), "server", "nodaemon"],
                                              stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                              stderr=subprocess.DEVNULL)
        wait_port(port)

    def stop_server(self, port: int) -> None:
        p = self.servers.pop(port)
        p.kill()
        p.wait()

    def start_device(self, port: int, server: int, profile: Path | None = None) -> str:
        """An adbd on 127.0.0.1:port, attached to the server at `server`; its serial. With `profile` (a
        tests/helpers/device_profile.py tree), the device has that profile laid over its /sys and its dumpsys on
        PATH (tests/adbd/device-profile.sh, which also gives it its own /data); a restarted device keeps it."""
        env = {"ADBD_PORT": str(port), "PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "HOME": "/"}
        if profile is not None:
            self.profiles[port] = profile
        profile = self.profiles.get(port)
        if profile is None:
            argv = ["sh", "-c", _DEVICE, self.adbd]
        else:
            env["BMOE_PROFILE_DATA_MB"] = "128"
            argv = [str(Path(__file__).resolve().parent.parent / "adbd" / "device-profile.sh"), str(profile), self.adbd]
        self.devices[port] = subprocess.Popen(
            ["unshare", "--mount", "--propagation", "private", "--", *argv],
            cwd="/", env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_port(port)
        self.attached[port] = server
        self.connect(port)
        return f"127.0.0.1:{port}"

    def connect(self, port: int) -> None:
        server, serial = self.attached[port], f"127.0.0.1:{port}"
        subprocess.run([self.adb, "-P", str(server), "connect", serial], check=True, capture_output=True, timeout=20)
        subprocess.run([self.adb, "-P", str(server), "-s", serial, "wait-for-device"], check=True, timeout=20)

    def kill_device(self, port: int) -> None:
        p = self.devices.pop(port)
        p.kill()
        p.wait()

    def close(self) -> None:
        for port in list(self.devices):
            self.kill_device(port)
        for port in list(self.servers):
            self.stop_server(port)


def write_engine(d: Path) -> Path:
    return sh_engine.write_engine(d, ENGINE)
