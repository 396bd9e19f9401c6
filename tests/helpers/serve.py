"""Shared by the server and web-page tests: a real `bmoe serve` process on loopback."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import httpx


class Server:
    def __init__(self, model: Path, tmp: Path, *flags: str, env: dict[str, str] | None = None,
                 headers: dict[str, str] | None = None):
        self.log = tmp / f"serve-{time.monotonic_ns()}.err"
        self.err = self.log.open("w")
        self.p = subprocess.Popen([sys.executable, "-m", "harness.engine.cli", "serve", "-m", str(model), "-t", "2",
                                   "--port", "0", *flags], stdout=subprocess.DEVNULL, stderr=self.err,
                                  env={**os.environ, **(env or {})})
        end = time.monotonic() + 120
        while not (m := re.search(r"serving \S+ on (http://[\d.]+:\d+)", self.log.read_text())):
            if self.p.poll() is not None or time.monotonic() > end:
                raise AssertionError(f"the server did not start: {self.log.read_text()}")
            time.sleep(0.1)
        self.url = m.group(1)
        self.host, self.port = self.url.removeprefix("http://").split(":")
        self.http = httpx.Client(base_url=self.url, timeout=120, headers=headers)

    def health(self) -> dict:
        return self.http.get("/health").json()

    def stderr(self) -> str:
        self.err.flush()
        return self.log.read_text()

    def stop(self) -> int:
        self.http.close()
        self.p.terminate()
        rc = self.p.wait(timeout=60)
        self.err.close()
        return rc
