"""A real TCP server that misbehaves the way a hung or overloaded adb server (or sshd) does: `stall` accepts every
connection and never answers; `trickle` answers one byte every `interval` seconds from `payload`. It serves each
connection on a daemon thread until it is closed, and counts the connections it accepted."""

from __future__ import annotations

import socket
import threading
import time


class StallServer:
    def __init__(self, mode: str = "stall", payload: bytes = b"", interval: float = 1.0):
        assert mode in ("stall", "trickle")
        self.mode, self.payload, self.interval = mode, payload, interval
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.accepted = 0
        self._stop = threading.Event()
        self._conns: list[socket.socket] = []
        threading.Thread(target=self._serve, daemon=True).start()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                c, _ = self.sock.accept()
            except OSError:
                return
            self.accepted += 1
            self._conns.append(c)
            threading.Thread(target=self._one, args=(c,), daemon=True).start()

    def _one(self, c: socket.socket) -> None:
        try:
            if self.mode == "stall":
                self._stop.wait()
                return
            for i in range(len(self.payload)):
                if self._stop.wait(self.interval):
                    return
                c.sendall(self.payload[i:i + 1])
            self._stop.wait()
        except OSError:
            return

    def close(self) -> None:
        self._stop.set()
        self.sock.close()
        for c in self._conns:
            try:
                c.close()
            except OSError:
                pass

    def __enter__(self) -> StallServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def wait_accepted(server: StallServer, n: int = 1, timeout: float = 60.0) -> None:
    t0 = time.monotonic()
    while server.accepted < n:
        assert time.monotonic() - t0 < timeout, "the server was never reached"
        time.sleep(0.05)
