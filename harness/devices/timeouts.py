"""How long a call to a device may take: every adb exchange and every SSH command has a bound, set by the
command (`bmoe-bench run --device-timeout S`, `bmoe-bench devices --timeout S`) for the whole process, or by a
campaign (`device_timeout_s:`) for its run when the command gives none.

- `call_s`: one exchange with an adb server (list the devices, open a transport, a short shell command) must be
  over within it; a server that trickles its answer (one byte a second) is named in one line when it is not.
- `stall_s`: no byte at all for this long, in any exchange (a push and a run's output stream included), is a stalled
  server or link, named in one line. SSH: its ConnectTimeout and keep-alive (3 unanswered probes) come from it.

Long transfers (a push, a pull) and a run's own output stream are bounded by the stall alone (and a run by its own
timeout); `unbounded()` marks them in the thread that makes them. A stalled or trickling adb server is
`LinkStalled`, an OSError that is not a TimeoutError (adbutils turns those into a bare "adb read timeout")."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass


@dataclass
class Timeouts:
    call_s: float = 30.0
    stall_s: float = 15.0
    by_command: bool = False  # set by a command's --device-timeout (a campaign's own setting then gives way)


LIMITS = Timeouts()
BOUND = "--device-timeout or a campaign's device_timeout_s sets the bound"  # said by every stall and time-out
_local = threading.local()


@contextlib.contextmanager
def command_limits(device_timeout: float | None) -> Iterator[None]:
    """A command's --device-timeout S for its duration: S for a call, half of it (at most 15 s) for a stall."""
    was = (LIMITS.call_s, LIMITS.stall_s, LIMITS.by_command)
    if device_timeout:
        LIMITS.call_s, LIMITS.stall_s = float(device_timeout), min(15.0, device_timeout / 2)
        LIMITS.by_command = True
    try:
        yield
    finally:
        LIMITS.call_s, LIMITS.stall_s, LIMITS.by_command = was


@contextlib.contextmanager
def campaign_limits(device_timeout_s: float | None) -> Iterator[None]:
    """A campaign's `device_timeout_s`, unless the command gave its own --device-timeout (that one wins)."""
    with command_limits(None if LIMITS.by_command else device_timeout_s):
        yield


@contextlib.contextmanager
def unbounded() -> Iterator[None]:
    """adb connections made in this thread meanwhile have no total bound, only the stall (long transfers)."""
    was = getattr(_local, "unbounded", False)
    _local.unbounded = True
    try:
        yield
    finally:
        _local.unbounded = was


class LinkStalled(OSError):
    """A server or link that answers too slowly or not at all (one line, naming it)."""


class GuardedSocket:
    """A connected socket whose every recv and send is bounded by the stall and, unless lifted, by a total deadline
    for the whole exchange; the caller's own settimeout (a poll) still works as before."""

    def __init__(self, sock: socket.socket, name: str, total_s: float | None, stall_s: float | None):
        self._sock, self._name = sock, name
        self._t0 = time.monotonic()
        self._total = None if getattr(_local, "unbounded", False) else total_s
        self._stall = stall_s
        self._user: float | None = None
        self.got = 0

    def lift_deadline(self) -> None:
        """From now on only the stall bounds this connection (a run's output stream: it has its own timeout)."""
        self._total = None

    def settimeout(self, t: float | None) -> None:
        self._user = t

    def gettimeout(self) -> float | None:
        return self._user

    def _arm(self) -> float | None:
        """The timeout for the next call: the caller's, the stall and what is left of the deadline, whichever first."""
        bounds = [b for b in (self._user, self._stall) if b is not None]
        if self._total is not None:
            left = self._t0 + self._total - time.monotonic()
            if left <= 0:
                raise self._too_slow()
            bounds.append(left)
        t = min(bounds) if bounds else None
        self._sock.settimeout(t)
        return t

    def _too_slow(self) -> LinkStalled:
        took = time.monotonic() - self._t0
        if self.got:
            return LinkStalled(f"{self._name} trickled: {self.got} bytes in {took:.0f} s and no whole answer within "
                               f"{self._total:g} s; is it overloaded, or not an adb server? ({BOUND})")
        return LinkStalled(f"{self._name} accepted the connection and answered nothing in {took:.0f} s; is it "
                           f"hung, or not an adb server? ({BOUND})")

    def _timed_out(self, t: float | None) -> BaseException:
        if self._user is not None and t == self._user:
            return TimeoutError("timed out")  # the caller's own poll
        if self._total is not None and time.monotonic() >= self._t0 + self._total - 0.01:
            return self._too_slow()
        if not self.got:
            return LinkStalled(f"{self._name} stalled: accepted the connection and answered nothing for "
                               f"{self._stall:g} s; is it hung, or not an adb server? ({BOUND})")
        return LinkStalled(f"{self._name} stalled: nothing for {self._stall:g} s after {self.got} bytes; is it "
                           f"hung? ({BOUND})")

    def recv(self, n: int, *flags: int) -> bytes:
        t = self._arm()
        try:
            data = self._sock.recv(n, *flags)
        except TimeoutError:
            raise self._timed_out(t) from None
        self.got += len(data)
        return data

    def send(self, data: bytes, *flags: int) -> int:
        t = self._arm()
        try:
            return self._sock.send(data, *flags)
        except TimeoutError:
            raise self._timed_out(t) from None

    def sendall(self, data: bytes, *flags: int) -> None:
        view = memoryview(data)
        while view:
            view = view[self.send(view, *flags):]

    def __getattr__(self, name: str):
        return getattr(self._sock, name)
