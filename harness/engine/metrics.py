"""Per-token telemetry: the `bmoe_metrics v2` CSV, BMOE_PROGRESS lines, the end-of-run summary.

Columns follow DESIGN.md section 5 (readers go by name). `compute_ms` is the residual
wall - stall - mgmt (ggml compute plus the hook's per-node overhead), labelled so in the preamble.
A value that was not measured is written as -1, never as 0.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import IO

COLUMNS = [
    "step", "steps", "wall_ms", "io_ms", "compute_ms", "read_bytes", "cache_hit_pct", "stall_ms", "mgmt_ms",
    "majflt", "cpu_ms", "dense_resident_frac", "turn", "majflt_mib", "cache_budget_mib", "rss_mib",
    "rss_anon_mib", "rss_file_mib", "swap_mib", "mem_available_mib", "mem_free_mib", "swap_free_mib",
    "loop_overhead_ms", "token_id",
]

UNMEASURED = -1


def escape(v: object) -> str:
    """Preamble values stay on one line: backslash, CR and LF are escaped."""
    return str(v).replace("\\", "\\\\").replace("\n", "\\n").replace("\r", "\\r")


def _fmt(v: object) -> str:
    if isinstance(v, float):
        return f"{v:.3f}"
    return str(v)


@dataclass
class Summary:
    n_decode: int = 0
    decode_s: float = 0.0
    n_prompt: int = 0
    prefill_s: float = 0.0
    ttft_s: float = 0.0
    load_s: float = 0.0
    read_bytes: int = 0
    hit_pct: float | None = None
    cache_resident_mib: float | None = None
    evictions: int | None = None
    extra: dict[str, object] = field(default_factory=dict)

    @property
    def decode_tok_s(self) -> float:
        return self.n_decode / self.decode_s if self.decode_s > 0 else 0.0

    @property
    def prefill_tok_s(self) -> float:
        return self.n_prompt / self.prefill_s if self.prefill_s > 0 else 0.0

    def fields(self) -> dict[str, object]:
        d: dict[str, object] = {
            "decode_tok_s": round(self.decode_tok_s, 4),
            "prefill_tok_s": round(self.prefill_tok_s, 4),
            "ttft_ms": round(self.ttft_s * 1e3, 3),
            "load_ms": round(self.load_s * 1e3, 3),
            "n_prompt": self.n_prompt,
            "n_decode": self.n_decode,
            "mib_read_per_token": round(self.read_bytes / 1048576 / max(self.n_decode, 1), 4),
            "hit_pct": UNMEASURED if self.hit_pct is None else round(self.hit_pct, 3),
            "cache_resident_mib": UNMEASURED if self.cache_resident_mib is None else round(self.cache_resident_mib, 3),
            "evictions": UNMEASURED if self.evictions is None else self.evictions,
        }
        d.update(self.extra)
        return d

    def human(self) -> str:
        f = self.fields()
        parts = [
            f"decode {f['decode_tok_s']:.2f} tok/s ({self.n_decode} tokens)",
            f"prefill {f['prefill_tok_s']:.2f} tok/s ({self.n_prompt} tokens)",
            f"TTFT {f['ttft_ms']:.0f} ms",
            f"load {f['load_ms']:.0f} ms",
            f"{f['mib_read_per_token']:.2f} MiB read/token",
        ]
        if self.hit_pct is not None:
            parts.append(f"hit {self.hit_pct:.1f}%")
            parts.append(f"cache resident {self.cache_resident_mib:.0f} MiB")
            parts.append(f"{self.evictions} evictions")
        return "bmoe: " + ", ".join(parts)


class CsvSink:
    """Writes the preamble at open, one row per token, and a `# summary` line per generation."""

    def __init__(self, path: str, preamble: dict[str, object]):
        self.path = path
        d = os.path.dirname(os.path.abspath(path))
        os.makedirs(d, exist_ok=True)
        self.f: IO[str] = open(path, "w", buffering=1)
        self.f.write("# bmoe_metrics v2\n")
        for k, v in preamble.items():
            self.f.write(f"# {k}={escape(v)}\n")
        self.f.write(",".join(COLUMNS) + "\n")

    def row(self, r: dict[str, object]) -> None:
        self.f.write(",".join(_fmt(r.get(c, UNMEASURED)) for c in COLUMNS) + "\n")

    def summary(self, s: Summary) -> None:
        self.f.write("# summary " + " ".join(f"{k}={v}" for k, v in s.fields().items()) + "\n")

    def close(self) -> None:
        self.f.close()


def progress_line(r: dict[str, object], text: str) -> str:
    keys = ("step", "steps", "wall_ms", "io_ms", "compute_ms", "mgmt_ms", "stall_ms", "cache_hit_pct",
            "majflt", "cpu_ms")
    d = {k: r.get(k, UNMEASURED) for k in keys}
    rb = r.get("read_bytes", UNMEASURED)
    d["read_mb"] = round(rb / 1048576, 4) if isinstance(rb, int) and rb >= 0 else UNMEASURED
    d["text"] = text
    return "BMOE_PROGRESS " + json.dumps(d, ensure_ascii=False)


class RouteTraceWriter:
    """`route_trace v1`: header comments, then turn,phase,step,layer,slot,expert,weight,residency,expert_bytes.
    The routing weight is not read by the hook (it would cost one more isolated node per layer), so the
    weight column is written as -1 (unmeasured)."""

    def __init__(self, path: str, model: str, arch: str, n_layer: int, n_expert: int, k: int,
                 expert_bytes: list[int], dense_bytes: dict[int, int]):
        self.f = open(path, "w")
        self.f.write("# route_trace v1\n")
        self.f.write(f"# model={model} arch={arch} n_layer={n_layer} n_expert={n_expert} n_expert_used={k}\n")
        for il in range(n_layer):
            self.f.write(f"# layer={il} expert_bytes={expert_bytes[il]} dense_bytes={dense_bytes.get(il, 0)}\n")
        self.f.write("turn,phase,step,layer,slot,expert,weight,residency,expert_bytes\n")
        self.expert_bytes = expert_bytes

    def events(self, turn: int, step: int, events) -> None:
        w = self.f.write
        for ev in events:
            eb = self.expert_bytes[ev.layer]
            for tok, row in enumerate(ev.ids.tolist()):
                st = step + tok if ev.phase == 0 else step
                for slot, e in enumerate(row):
                    w(f"{turn},{ev.phase},{st},{ev.layer},{slot},{e},-1,{ev.residency.get(e, 0)},{eb}\n")

    def close(self) -> None:
        self.f.close()
