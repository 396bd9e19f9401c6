"""The adb server a device is reached through, named by `host:port`, and spoken to without adbutils' two
surprises (read in adbutils 2.x's source, `_adb.py` and `_device_base.py`):

- `AdbConnection._safe_connect`: when the connection to the server fails, adbutils runs `adb start-server`
  on THIS machine and tries again. With a lab's server at lab1:5037 down, that starts a local server (at
  $ANDROID_ADB_SERVER_PORT, else 5037) and, when the named server is this machine's, quietly talks to the
  new empty one: the campaign would see other devices, or none, instead of an error. `ServerClient`
  connects once and reports a failure as `ServerUnreachable`, naming the server; nothing is ever started.
- `BaseDevice.forward_port` picks a free port on the harness's machine, but the forward is opened by the
  server, on the server's host, where that port may be taken. bmoe never forwards: every byte (shell v2,
  sync push and pull) goes through the server's own connection, so a remote server needs no port of its
  own beyond its listening one. (tests/bench/test_adb_client.py checks that nothing in harness/ calls it.)
"""

from __future__ import annotations

from dataclasses import dataclass

import adbutils
from adbutils import AdbClient
from adbutils._adb import AdbConnection

from harness.devices.timeouts import LIMITS, GuardedSocket, LinkStalled
from harness.formats.campaign_fleet import DEFAULT_SERVER as DEFAULT_SERVER  # re-exported
from harness.formats.campaign_fleet import parse_server as parse_server
from harness.formats.campaign_fleet import server_name


class ServerUnreachable(adbutils.AdbError):
    """The adb server at host:port did not accept a connection (an adbutils.AdbError, so that adbutils'
    own callers and harness.devices.adb.ADB_ERRORS treat it as any failed adb call)."""


class _Connection(AdbConnection):
    def __init__(self, host: str, port: int, name: str, total_s: float):
        self._guard = (name, total_s)
        super().__init__(host, port)

    def _safe_connect(self):  # adbutils' version starts a local adb server when this fails: never
        name, total_s = self._guard
        # a command given longer than a call (a sha256 of a large file) may be silent until it ends: its own bound
        stall = LIMITS.stall_s if total_s <= LIMITS.call_s else None
        return GuardedSocket(self._create_socket(), f"adb server {name}", total_s, stall)


class ServerClient(AdbClient):
    """adbutils' AdbClient for the server at host:port that never starts a server: a failed connection is
    `ServerUnreachable` ("adb server H:P unreachable (...)"). Every exchange is bounded (harness.devices.timeouts): by
    `timeout` when the caller gives one, else by the command's call bound; a server that stalls or trickles is
    `LinkStalled`, one line naming it."""

    def __init__(self, host: str = "127.0.0.1", port: int = 5037, socket_timeout: float | None = None):
        super().__init__(host=host, port=port, socket_timeout=socket_timeout)
        self._timeout = socket_timeout

    @property
    def name(self) -> str:
        return server_name(self.host, self.port)

    def make_connection(self, timeout: float | None = None) -> AdbConnection:
        try:
            return _Connection(self.host, self.port, self.name, timeout or self._timeout or LIMITS.call_s)
        except (adbutils.AdbError, OSError) as e:
            raise ServerUnreachable(f"adb server {self.name} unreachable ({_why(e)}); is `adb -a -P {self.port} "
                                    f"server nodaemon` running there?") from None


def _why(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return text[-1] if text else type(e).__name__


@dataclass(frozen=True)
class Listed:
    serial: str
    state: str  # adb's: device, offline, unauthorized, ...


def list_server(host: str, port: int) -> list[Listed]:
    """The devices the server at host:port lists; ServerUnreachable naming it when it does not answer."""
    try:
        return [Listed(d.serial, d.state) for d in ServerClient(host, port).list()]
    except ServerUnreachable:
        raise
    except LinkStalled as e:
        raise ServerUnreachable(str(e)) from None
    except (adbutils.AdbError, OSError, EOFError, ValueError) as e:  # ValueError: a length that is not hex
        raise ServerUnreachable(f"adb server {server_name(host, port)} failed to list its devices "
                                f"({_why(e)})") from None
