"""The engines the adb tests push to a device: POSIX sh scripts that parse the harness's flags and write a
bmoe_metrics v2 CSV (tokens of $ms ms) where --csv says, each test adding its own flags and what they do; and the
campaign file that pushes such an engine and a model to an adb device."""

from __future__ import annotations

import os
import textwrap
from pathlib import Path

# prints a BMOE_PROGRESS line per token, $n of them, at $ms ms each
PROGRESS = r"""i=0
while [ "$i" -lt "$n" ]; do i=$((i + 1)); echo "BMOE_PROGRESS {\"step\": $i, \"steps\": $n, \"wall_ms\": $ms}"; done
"""

_CSV = r"""{
  echo "# bmoe_metrics v2"; echo "# engine_version=sh-engine 1"; echo "# ms=$ms"
  echo "step,steps,wall_ms,read_bytes"
  i=0; while [ "$i" -lt "$n" ]; do i=$((i + 1)); echo "$i,$n,$ms,1048576"; done
  echo "# summary tokens=$n"
} > "$csv.part"
mv "$csv.part" "$csv"
"""


def sh_engine(init: str, flags: tuple[str, ...] = (), before: str = "", after: str = "") -> str:
    """A #!/bin/sh engine ("sh-engine 1"): `init` sets its variables (n, csv, m, and ms unless `before` does);
    it parses -m, -n, -p, --csv, --version and the case arms in `flags` (e.g. `--slow) ms=200; shift;;`), exits 2
    when the model is not on the device, runs `before`, writes the CSV (atomically, through $csv.part), then
    runs `after` (e.g. PROGRESS)."""
    arms = "".join(f"    {a}\n" for a in flags)
    return (f'#!/bin/sh\n{init}\nwhile [ $# -gt 0 ]; do\n  case "$1" in\n'
            '    -m) m="$2"; shift 2;;\n    -n) n="$2"; shift 2;;\n    -p) shift 2;;\n    --csv) csv="$2"; shift 2;;\n'
            f'{arms}    --version) echo "sh-engine 1"; exit 0;;\n    *) shift;;\n  esac\ndone\n'
            '[ -f "$m" ] || { echo "sh-engine: no model at $m" >&2; exit 2; }\n'
            f"{before}{_CSV}{after}")


def write_engine(d: Path, engine: str) -> Path:
    """`engine` written to d/sh-engine, executable; its path."""
    p = d / "sh-engine"
    p.write_text(engine)
    p.chmod(0o755)
    return p


def adb_campaign(tmp_path: Path, engine: str, *, name: str, serial: str, keys: str, file: str = "a.yaml") -> Path:
    """The campaign `name` at tmp_path/file: it pushes `engine` (written to tmp_path/sh-engine) and 8 KiB of random
    bytes (tmp_path/model.gguf) to the adb device `serial`; `keys` (YAML, dedented) follow."""
    eng = write_engine(tmp_path, engine)
    model = tmp_path / "model.gguf"
    model.write_bytes(os.urandom(8192))
    p = tmp_path / file
    p.write_text(f'name: {name}\nmodel: {{push_from: {model}}}\ntarget: {{kind: adb, serial: "{serial}"}}\n'
                 f"engine: {{kind: external, push_from: {eng}}}\n" + textwrap.dedent(keys))
    return p
