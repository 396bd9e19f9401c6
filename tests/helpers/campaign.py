"""Campaign files for the validation tests: a good campaign to vary, and a good fidelity campaign (on a synthetic
model, its text inline) for the fidelity and held-out tests; written to a file, and the error lines planning it
gives."""

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

FIDELITY_TEXT = "The quick brown fox jumps over the lazy dog, and then it runs away into the woods. " * 6
FIDELITY_GOOD = f"""\
name: f
model: {{recipe: {{n_layer: 2, n_expert: 8, n_expert_used: 4}}}}
target: local
flags: {{-t: 1, --moe-stream: true, --cache-mb: 4, --n-expert-used: 4, --drop-cold-experts: 0,
        --cache-policy: aged-markov}}
axes:
  - {{flag: --n-expert-used, values: [4, 2]}}
  - {{flag: --drop-cold-experts, values: [0, 1.0]}}
  - {{flag: --cache-policy, values: [aged-markov, lru]}}
repeats: 1
tokens: 4
fidelity:
  text: "{FIDELITY_TEXT}"
  ctx: 32
  chunks: 4
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
