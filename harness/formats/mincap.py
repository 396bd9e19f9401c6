"""`mincap v1`: what `bmoe-bench mincap` and `bmoe-bench footprint` store in a folder, one JSON object a line in
`mincap.jsonl` (appended: several searches can share a folder).

Every line has `record` and `v`:
- `probe`: one capped run: `label`, `cap_mib`, `repeat`, `runs` (the criterion's verdict, harness.memcap.search),
  `reason` (why not; null when it ran), `exit_code`, `oom_kills`, `timed_out`, `wall_s`, `tokens`, `tok_s` (decode,
  warm-up tokens left out), `peak_mib` (the cgroup's own peak: memory.max_usage_in_bytes / memory.peak, page cache
  and kernel memory included) and, at the sample where anonymous + kernel memory was highest (sampled every
  `interval_s`), the charge split `anon_mib`,
  `file_mib`, `kernel_mib`.
- `search`: one search's answer: `label`, `argv`, `resolution_mib`, `slowdown`, `repeats`, `warmup`, `roomy_cap_mib`,
  `roomy_tok_s`, `roomy_peak_mib`, `min_cap_mib` (null when the bracket did not hold the edge), `fails_at_mib`,
  `note`, `host`.
- `breakdown`: one run's memory by kind (harness.memcap.smaps) at the sample of highest anonymous memory: `label`,
  `cap_mib`, `argv`, `kinds` ({kind: {rss_mib, anon_mib, size_mib, count}}), `rollup_mib` (smaps_rollup: Rss,
  Anonymous, ...), `charge_mib` (the cgroup's anon, file, file_mapped, kernel, usage at that sample), `peak_mib`,
  `engine_lines` (the engine's stderr lines about memory: bmoe's notes and summary, llama.cpp's buffer sizes).
"""

from __future__ import annotations

import json
from pathlib import Path

from harness.errors import UserError
from harness.formats.folder_guard import MAX_RAW, loads, read_text

FILE = "mincap.jsonl"
VERSION = 1
REQUIRED = {
    "probe": ("label", "cap_mib", "repeat", "runs", "reason", "exit_code", "oom_kills", "timed_out", "wall_s",
              "tokens", "tok_s", "peak_mib", "anon_mib", "file_mib", "kernel_mib"),
    "search": ("label", "argv", "resolution_mib", "slowdown", "repeats", "warmup", "roomy_cap_mib", "roomy_tok_s",
               "roomy_peak_mib", "min_cap_mib", "fails_at_mib", "note", "host"),
    "breakdown": ("label", "cap_mib", "argv", "kinds", "rollup_mib", "charge_mib", "peak_mib", "engine_lines"),
}


def line(record: str, fields: dict) -> str:
    """One stored line; refuses a record kind or a field set this format does not declare."""
    need = REQUIRED.get(record)
    if need is None:
        raise ValueError(f"mincap: no record kind {record!r}")
    missing = [k for k in need if k not in fields]
    extra = [k for k in fields if k not in need]
    if missing or extra:
        raise ValueError(f"mincap {record}: missing {missing}, undeclared {extra}")
    return json.dumps({"record": record, "v": VERSION, **fields}, sort_keys=False)


def append(folder: Path, record: str, fields: dict) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / FILE, "a", encoding="utf-8") as f:
        f.write(line(record, fields) + "\n")


def read(path: Path) -> list[dict]:
    """Every record of a mincap.jsonl, checked: a line that is not one of this version's records is refused with the
    file's name and the line's number."""
    try:
        text = read_text(path, MAX_RAW)
    except OSError as e:
        raise UserError(f"{path}: cannot read ({e.strerror})") from None
    out = []
    for n, s in enumerate(text.splitlines(), 1):
        if not s.strip():
            continue
        try:
            obj = loads(s, f"{path}:{n}")
        except json.JSONDecodeError:
            raise UserError(f"{path}:{n}: not a JSON object (a truncated file?)") from None
        if not isinstance(obj, dict):
            raise UserError(f"{path}:{n}: not a JSON object") from None
        kind = obj.get("record")
        if kind not in REQUIRED or obj.get("v") != VERSION:
            raise UserError(f"{path}:{n}: not a mincap v{VERSION} record (record={kind!r}, v={obj.get('v')!r})")
        missing = [k for k in REQUIRED[kind] if k not in obj]
        if missing:
            raise UserError(f"{path}:{n}: {kind} record without {missing[0]}")
        out.append(obj)
    return out
