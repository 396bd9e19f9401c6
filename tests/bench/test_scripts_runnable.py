"""Every shell script the repository ships is committed executable and starts with a shebang, so the commands the
README and the scripts' own usage lines give (`sudo ./scripts/arm-gates.sh`, ...) run as written on a clone.
(scripts/arm-gates.sh was committed 644 for two sessions: its README command failed with Permission denied.)"""

from __future__ import annotations

import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_every_committed_shell_script_is_executable_with_a_shebang():
    out = subprocess.run(["git", "ls-files", "-s", "--", "*.sh", ".ci/run"], cwd=ROOT, capture_output=True,
                         text=True, check=True).stdout
    rows = [ln.split(maxsplit=3) for ln in out.splitlines()]
    assert len(rows) >= 10, out
    bad = [path for mode, _, _, path in rows if mode != "100755"]
    assert bad == [], f"committed without the executable bit: {bad} (git update-index --chmod=+x)"
    no_bang = [path for *_, path in rows if not (ROOT / path).read_bytes().startswith(b"#!")]
    assert no_bang == [], no_bang
