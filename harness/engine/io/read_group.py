"""Several reads waited for as one (`Gather`), and waiting for reads whatever their outcome (`wait_done`): the
pieces that let a reader hand back one handle per batch of reads, from the Python lanes or the compiled ones."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from concurrent.futures import CancelledError
from typing import Any


class Gather:
    """The reads of one batch: `result()` is (bytes, read ns) summed over them and raises the first failure."""

    __slots__ = ("parts",)

    def __init__(self, parts: Sequence[Any]):
        self.parts = parts

    def result(self, timeout: float | None = None) -> tuple[int, int]:
        got = ns = 0
        for f in self.parts:
            g, n = f.result()
            got += g
            ns += n
        return got, ns

    def done(self) -> bool:
        return all(f.done() for f in self.parts)

    def exception(self, timeout: float | None = None) -> BaseException | None:
        for f in self.parts:
            e = f.exception()
            if e is not None:
                return e
        return None


def wait_done(futs: Iterable[Any]) -> None:
    """Until every read has finished, failed or been cancelled (as concurrent.futures.wait, for any read handle)."""
    for f in futs:
        try:
            f.exception()
        except CancelledError:
            pass


def chunks(items: Sequence[Any], parts: int) -> list[Sequence[Any]]:
    """`items` in at most `parts` contiguous runs of near-equal length, in order."""
    n = len(items)
    k = max(1, min(parts, n))
    q, r = divmod(n, k)
    out, i = [], 0
    for j in range(k):
        m = q + (j < r)
        out.append(items[i:i + m])
        i += m
    return out
