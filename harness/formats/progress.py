"""`BMOE_PROGRESS {json}`: one stdout line per token while the engine runs (not stored; the runner
parses it live for its progress display). Fields: step, steps, wall_ms, io_ms, compute_ms, mgmt_ms,
stall_ms, read_mb, cache_hit_pct, majflt, cpu_ms, and the token's text delta; -1 = unmeasured."""

from __future__ import annotations

import json

PREFIX = "BMOE_PROGRESS "
UNMEASURED = -1
_KEYS = ("step", "steps", "wall_ms", "io_ms", "compute_ms", "mgmt_ms", "stall_ms", "cache_hit_pct", "majflt",
         "cpu_ms")


def progress_line(row: object, text: str) -> str:
    """The line for one token row (any object with the TokenRow attribute names)."""
    d: dict[str, object] = {k: getattr(row, k, UNMEASURED) for k in _KEYS}
    rb = getattr(row, "read_bytes", UNMEASURED)
    d["read_mb"] = round(rb / 1048576, 4) if isinstance(rb, int) and rb >= 0 else UNMEASURED
    d["text"] = text
    return PREFIX + json.dumps(d, ensure_ascii=False)


def parse_progress(line: str) -> dict | None:
    """The fields of a progress line, or None for any other line (or a malformed one)."""
    if not line.startswith(PREFIX):
        return None
    try:
        d = json.loads(line[len(PREFIX):])
    except json.JSONDecodeError:
        return None
    return d if isinstance(d, dict) else None
