"""Campaign files for the validation tests: a good campaign to vary, written to a file, and the error lines
planning it gives."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from harness.campaigns.validate import plan_campaign
from harness.campaigns.yamlsrc import CampaignError

GOOD = """\
name: t
model: {recipe: {n_layer: 2}}
target: {kind: local, mem_cap_mib: 512}
flags: {-t: 2, --moe-stream: true}
axes:
  - flag: --cache-mb
    values: [0, 64]
repeats: 2
tokens: 8
warmup_tokens: 2
"""


def write(tmp_path: Path, text: str, name: str = "c.yaml") -> Path:
    p = tmp_path / name
    p.write_text(textwrap.dedent(text))
    return p


def errors(path: Path) -> list[str]:
    """The error lines planning the campaign at `path` gives (it must fail)."""
    with pytest.raises(CampaignError) as ei:
        plan_campaign(path)
    return ei.value.lines
