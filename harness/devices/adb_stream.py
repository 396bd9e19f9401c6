"""The decoder of adb's shell v2 protocol (`V2Stream`: separate stdout and stderr, then the exit code), for
`harness.devices.adb.Device.run`. Pure: no adb connection here."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import TextIO

LineCallback = Callable[[str], None]


class V2Stream:
    """Decodes adb shell v2 frames (id byte, little-endian u32 length, payload): 1 stdout, 2 stderr,
    3 exit code. Writes both streams to the log and stdout lines to the callback."""

    def __init__(self, log: TextIO, on_stdout_line: LineCallback | None):
        self.buf = b""
        self.log = log
        self.cb = on_stdout_line
        self.cb_error: BaseException | None = None
        self.partial = {1: b"", 2: b""}
        self.stderr_tail: deque[str] = deque(maxlen=20)
        self.exit_code: int | None = None

    def feed(self, data: bytes) -> None:
        self.buf += data
        while len(self.buf) >= 5 and self.exit_code is None:
            kind, length = self.buf[0], int.from_bytes(self.buf[1:5], "little")
            if len(self.buf) < 5 + length:
                return
            payload, self.buf = self.buf[5 : 5 + length], self.buf[5 + length :]
            if kind == 3:
                self.exit_code = payload[0] if payload else 255
            elif kind in (1, 2):
                self._lines(kind, payload)

    def _lines(self, kind: int, payload: bytes) -> None:
        data = self.partial[kind] + payload
        *complete, self.partial[kind] = data.split(b"\n")
        for raw in complete:
            self._line(kind, raw.decode("utf-8", errors="replace").rstrip("\r"))

    def _line(self, kind: int, text: str) -> None:
        self.log.write(text + "\n")
        self.log.flush()
        if kind == 2:
            self.stderr_tail.append(text)
        elif self.cb is not None and self.cb_error is None:
            try:
                self.cb(text)
            except BaseException as e:  # reported after the run
                self.cb_error = e

    def flush(self) -> None:
        for kind in (1, 2):
            if self.partial[kind]:
                raw, self.partial[kind] = self.partial[kind], b""
                self._line(kind, raw.decode("utf-8", errors="replace").rstrip("\r"))
