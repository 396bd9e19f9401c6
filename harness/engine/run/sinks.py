"""Telemetry sinks: where a run's token rows go (the formats' writers do the writing).

Each sink takes every `TokenRow` with its text delta, then the summary once, then is closed.
"""

from __future__ import annotations

import codecs
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol, TextIO, TypeVar, cast

from harness.engine.run.paths import write_error
from harness.formats.metrics_csv import MetricsWriter, Summary, TokenRow
from harness.formats.progress import progress_line

W = TypeVar("W")

if TYPE_CHECKING:
    from harness.engine.io.tracing import Tracing
    from harness.engine.stream.hook import StreamHook
    from harness.formats.route_trace import RouteTraceWriter
    from harness.formats.traces import TraceWriter


def guarded(label: str, path: str, make: Callable[[], W]) -> W:
    """The writer `make()` opens, every later call on it guarded: an OSError (a read-only folder, a full disk,
    /dev/full) becomes one line naming the flag and the path (harness.engine.paths.write_error)."""
    try:
        return cast(W, _Guarded(make(), label, path))
    except OSError as e:
        raise write_error(label, path, e) from None


class _Guarded:
    def __init__(self, inner: object, label: str, path: str):
        self._inner, self._label, self._path = inner, label, path

    def __getattr__(self, name: str):
        attr = getattr(self._inner, name)
        if not callable(attr):
            return attr

        def call(*a, **kw):
            try:
                return attr(*a, **kw)
            except OSError as e:
                raise write_error(self._label, self._path, e) from None
        return call


class Sink(Protocol):
    def row(self, row: TokenRow, text: str) -> None: ...

    def finish(self, summary: Summary) -> None: ...

    def close(self) -> None: ...


class CsvSink:
    """The per-token `bmoe_metrics` CSV: preamble at open, one row per token, the summary line."""

    def __init__(self, writer: MetricsWriter):
        self.writer = writer

    def row(self, row: TokenRow, text: str) -> None:
        self.writer.row(row)

    def finish(self, summary: Summary) -> None:
        self.writer.summary(summary)

    def close(self) -> None:
        self.writer.close()


class RouteTraceSink:
    """The `route_trace` file: after each token, the routing decisions the hook recorded for it (the first
    token's come after the prompt's, which are written as step 0)."""

    def __init__(self, writer: RouteTraceWriter, hook: StreamHook):
        self.writer = writer
        self.hook = hook

    def _flush(self, step: int) -> None:
        events = self.hook.take_routes()
        prefill = [e for e in events if e.phase == 0]
        if prefill:
            self.writer.events(0, 0, prefill)
        self.writer.events(0, step, [e for e in events if e.phase != 0])

    def row(self, row: TokenRow, text: str) -> None:
        self._flush(row.step)

    def finish(self, summary: Summary) -> None:
        self._flush(0)  # a generation that ended at once still has its prompt's routing

    def close(self) -> None:
        self.writer.close()


class TraceSink:
    """The `io_trace` and `compute_trace` files (either may be None): after each token, what the recorders
    hold for it (the first token's come after the prompt's); at the end, every read still unsettled."""

    def __init__(self, tracing: Tracing, io: TraceWriter | None, compute: TraceWriter | None):
        self.tracing, self.io, self.compute = tracing, io, compute

    def _flush(self, turn: int, final: bool) -> None:
        t = self.tracing
        if self.io is not None and t.io is not None:
            self.io.rows(t.io.take(turn, final))
        if self.compute is not None and t.compute is not None:
            self.compute.rows(t.compute.take(turn))

    def row(self, row: TokenRow, text: str) -> None:
        self._flush(row.turn, False)

    def finish(self, summary: Summary) -> None:
        self._flush(0, True)

    def close(self) -> None:
        for w in (self.io, self.compute):
            if w is not None:
                w.close()


class TextSink:
    """stdout: the generated text alone, or one `BMOE_PROGRESS {json}` line per token (--progress)."""

    def __init__(self, out: TextIO, progress: bool):
        self.out = out
        self.progress = progress
        self._dec = codecs.getincrementaldecoder("utf-8")("replace")
        # the line of a token that ended inside a UTF-8 character, written with the next token (or at the end, where
        # the cut-off character's U+FFFD joins it)
        self._held: tuple[TokenRow, str] | None = None

    def row(self, row: TokenRow, text: str) -> None:
        """`text` holds the token's raw bytes (undecodable ones as surrogate escapes): plain output writes
        those bytes as they are; a progress line is JSON, so its text is decoded incrementally: the bytes of a
        character split over tokens wait for the rest and come whole in the line of the token that completes
        it, so the lines' texts joined are the whole output decoded (U+FFFD only where that has one)."""
        raw = text.encode("utf-8", "surrogateescape")
        if self.progress:
            self._release("")
            piece = self._dec.decode(raw)
            if self._dec.getstate()[0]:
                self._held = (row, piece)
            else:
                self._write(progress_line(row, piece) + "\n")
            return
        if hasattr(self.out, "buffer"):
            self.out.flush()
            self.out.buffer.write(raw)
        else:
            self.out.write(raw.decode("utf-8", "replace"))
        self.out.flush()

    def _write(self, line: str) -> None:
        self.out.write(line)
        self.out.flush()

    def _release(self, tail: str) -> None:
        if self._held is not None:
            (row, piece), self._held = self._held, None
            self._write(progress_line(row, piece + tail) + "\n")

    def finish(self, summary: Summary) -> None:
        if self.progress:
            self._release(self._dec.decode(b"", final=True))
            self._dec.reset()
        else:
            self.out.write("\n")

    def close(self) -> None:
        pass
