"""`io_trace v1` and `compute_trace v1`: where a token's time goes, read by read and layer by layer.

Both files: a `# <format> v1` line, `# key=value` preamble lines (the value is the rest of the line), the
column header, then one row per line. Every `*_ns` column of both files is one clock, `time.perf_counter_ns()`
(CLOCK_MONOTONIC on Linux), as absolute nanoseconds: the two files of one run share it and can be laid side by
side. Each preamble says that tracing perturbs the run (`perturbs=`) and by how much where measured.

io_trace: one row per positioned slice read of a routed expert (one tensor of one expert):

    read,turn,phase,step,layer,expert,tensor,kind,lane,offset,length,bytes,issued_ns,started_ns,finished_ns,outcome

`read` is the read's id (rows may come out of id order when a read settles late); `phase` 0 is the prompt's
batch (step 0), 1 a generated token (step 1..n), the token during which the read was *issued*; `tensor` is the
expert tensor's kind (gate, up, down, gate_up); `kind` is `demand` (the token routed to it and waits for it) or
`speculative` (issued ahead, may never be used); `lane` is the reader thread that did it (0..io_threads-1);
`offset` and `length` are the slice's place in its file; `bytes` what the read moved (with O_DIRECT the
page-aligned superset); `issued_ns` when the engine asked for it, `started_ns`/`finished_ns` when a lane began
and ended it; `outcome` is `used`, `wasted` (a speculative read nothing used) or `unknown`. A value never
filled (the run ended first) is -1.

compute_trace: the compute thread's time, cut where Python sees it (the routing callbacks and the expert
matmul asks), one row per interval:

    turn,phase,step,layer,state,start_ns,end_ns

`state` is `compute` (everything outside the engine's Python between two callbacks: ggml's kernels, the
scheduler's walk over the graph, the ctypes crossing), `wait` (the engine blocked on expert reads) or `hook`
(the engine's own Python in a callback, waits excluded). The scheduler asks about nodes while it gathers a
group and computes the group after the ask that isolates a node, so kernels run only inside `compute`
intervals, and a short one may be the walk alone; forwarding every ask to Python would add callbacks (and
their cost) without cutting the kernels any finer. `layer` is the span the interval falls in: layer l's span
runs from its routing node to the next one, so it holds layer l's expert matmuls and layer l+1's attention and
router (the last span: the last layer's experts and the output head); layer -1 is from the decode call to the
first routing node (embeddings, the first attention, llama.cpp's own per-call work). The intervals of one
token are contiguous from the decode call to its return. A layer's compute time for a token is the sum of its
`compute` intervals (`layer_totals`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import astuple, dataclass, fields
from pathlib import Path

from harness.errors import TraceFormatError, UserError
from harness.formats.folder_guard import MAX_RAW, read_capped

IO_FORMAT, COMPUTE_FORMAT, VERSION = "io_trace", "compute_trace", 1
CLOCK = "perf_counter_ns (CLOCK_MONOTONIC), absolute ns; shared by the io_trace and compute_trace of a run"
KINDS = ("demand", "speculative")
OUTCOMES = ("used", "wasted", "unknown")
STATES = ("compute", "wait", "hook")
UNFILLED = -1


@dataclass(frozen=True)
class ReadRow:
    read: int
    turn: int
    phase: int
    step: int
    layer: int
    expert: int
    tensor: str
    kind: str
    lane: int
    offset: int
    length: int
    bytes: int
    issued_ns: int
    started_ns: int
    finished_ns: int
    outcome: str


@dataclass(frozen=True)
class Interval:
    turn: int
    phase: int
    step: int
    layer: int
    state: str
    start_ns: int
    end_ns: int


IO_COLUMNS = [f.name for f in fields(ReadRow)]
COMPUTE_COLUMNS = [f.name for f in fields(Interval)]
_STR = {"tensor", "kind", "outcome", "state"}


@dataclass
class TraceFile:
    format: str
    meta: dict[str, str]
    rows: list  # ReadRow or Interval


class TraceWriter:
    """Writes the preamble at open, rows as they come (line-buffered: a killed engine leaves whole rows)."""

    def __init__(self, path: str | Path, fmt: str, preamble: dict[str, object]):
        self.f = open(path, "w", buffering=1)
        self.f.write(f"# {fmt} v{VERSION}\n# clock={CLOCK}\n")
        for k, v in preamble.items():
            self.f.write(f"# {k}={v}\n")
        self.f.write(",".join(IO_COLUMNS if fmt == IO_FORMAT else COMPUTE_COLUMNS) + "\n")

    def rows(self, rows: Iterable[ReadRow | Interval | tuple]) -> None:
        """Rows as dataclasses or as tuples in column order."""
        self.f.write("".join(",".join(map(str, r if isinstance(r, tuple) else astuple(r))) + "\n" for r in rows))

    def close(self) -> None:
        self.f.close()


def _check_read(r: ReadRow, io_threads: int | None) -> str | None:
    if r.kind not in KINDS:
        return f"kind {r.kind!r} is not one of {', '.join(KINDS)}"
    if r.outcome not in OUTCOMES:
        return f"outcome {r.outcome!r} is not one of {', '.join(OUTCOMES)}"
    if r.phase not in (0, 1):
        return f"phase {r.phase} is neither 0 (prefill) nor 1 (decode)"
    if r.finished_ns != UNFILLED and not r.finished_ns >= r.started_ns >= r.issued_ns:
        return "times are not issued <= started <= finished"
    if r.lane != UNFILLED and not (0 <= r.lane and (io_threads is None or r.lane < io_threads)):
        return f"lane {r.lane} outside 0..io_threads-1 ({io_threads})"
    return None


def _check_interval(r: Interval) -> str | None:
    if r.state not in STATES:
        return f"state {r.state!r} is not one of {', '.join(STATES)}"
    if r.end_ns < r.start_ns:
        return "end_ns before start_ns"
    return None


def parse_trace(lines: Iterable[str]) -> TraceFile:
    """Parse an io_trace or a compute_trace (pure). Raises TraceFormatError on anything malformed."""
    lines = [ln.rstrip("\r\n") for ln in lines]
    head = lines[0].split() if lines else []
    if len(head) != 3 or head[0] != "#" or head[1] not in (IO_FORMAT, COMPUTE_FORMAT):
        raise TraceFormatError(f"first line is not '# {IO_FORMAT} v{VERSION}' or '# {COMPUTE_FORMAT} v{VERSION}'")
    fmt = head[1]
    if head[2] != f"v{VERSION}":
        raise TraceFormatError(f"{fmt} version {head[2]!r} is not supported (this reader knows v{VERSION})")
    hdr = next((i for i, ln in enumerate(lines) if not ln.startswith("#")), None)
    if hdr is None:
        raise TraceFormatError("no column header after the preamble")
    meta = dict(ln[2:].split("=", 1) for ln in lines[1:hdr] if "=" in ln)
    cls, cols = (ReadRow, IO_COLUMNS) if fmt == IO_FORMAT else (Interval, COMPUTE_COLUMNS)
    if lines[hdr].split(",") != cols:
        raise TraceFormatError(f"column header is {lines[hdr]!r}, expected {','.join(cols)}")
    try:
        io_threads = int(meta["io_threads"]) if "io_threads" in meta else None
    except ValueError:
        raise TraceFormatError(f"io_threads={meta['io_threads']!r} is not a number") from None
    rows = []
    for n, ln in enumerate(lines[hdr + 1:], start=hdr + 2):
        if not ln:
            continue
        f = ln.split(",")
        try:
            if len(f) != len(cols):
                raise ValueError
            r = cls(*(v if c in _STR else int(v) for c, v in zip(cols, f, strict=True)))
        except ValueError:
            raise TraceFormatError(f"line {n}: expected {len(cols)} fields ({','.join(cols)}), got {ln!r}") from None
        bad = _check_read(r, io_threads) if cls is ReadRow else _check_interval(r)
        if bad:
            raise TraceFormatError(f"line {n}: {bad}")
        rows.append(r)
    return TraceFile(fmt, meta, rows)


def read_trace(path: str | Path, fmt: str) -> TraceFile:
    """Read a trace file of format `fmt`; any problem is a one-line UserError naming the file."""
    p = Path(path)
    flag = "--io-trace" if fmt == IO_FORMAT else "--compute-trace"
    hint = f"give a {fmt} v{VERSION} file (bmoe --moe-stream {flag} FILE writes one)"
    try:
        t = parse_trace(read_capped(p, MAX_RAW).decode("utf-8").splitlines())
    except (OSError, UnicodeDecodeError) as e:
        raise UserError(f"{fmt} {p}: cannot read it ({e.__class__.__name__}: {e}); {hint}") from None
    except TraceFormatError as e:
        raise UserError(f"{fmt} {p}: {e}; {hint}") from None
    if t.format != fmt:
        raise UserError(f"{fmt} {p}: it is a {t.format} file; {hint}")
    return t


def read_io_trace(path: str | Path) -> TraceFile:
    return read_trace(path, IO_FORMAT)


def read_compute_trace(path: str | Path) -> TraceFile:
    return read_trace(path, COMPUTE_FORMAT)


def layer_totals(intervals: Iterable[Interval]) -> dict[tuple[int, int, int, int], dict[str, int]]:
    """(turn, phase, step, layer) -> ns spent in each state (compute, wait, hook)."""
    out: dict[tuple[int, int, int, int], dict[str, int]] = {}
    for r in intervals:
        d = out.setdefault((r.turn, r.phase, r.step, r.layer), dict.fromkeys(STATES, 0))
        d[r.state] += r.end_ns - r.start_ns
    return out
