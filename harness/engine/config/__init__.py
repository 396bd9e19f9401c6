"""Every `bmoe` flag, declared once as one field of `EngineConfig` (fields.py); the cross-field rules and
`parse_cli` (rules.py); the README's flag table derived from the declaration (doc.py).

Each field carries its flag(s), type (the annotation), default, range or choices, help, whether it needs
`--moe-stream` and whether it is lossy. The argparse parser, `validate`, the resolved preamble
(`EngineConfig.resolved()`, the CSV's `cfg.<name>` keys), the stream-only rule and the README's flag
table are all derived from these fields, so a new flag is one `opt(...)` line in fields.py (plus a cross-field
rule in rules.py's `_RULES` when it has one).

`parse_cli(argv)` is pure (no file access): the harness uses it to refuse, at campaign validation
time, any flag combination the engine itself would refuse. Checks that need the model file (expert
count, token cycle) happen at load (`validate_for_model`, `cache.budget.plan_cache`).

`python -m harness.engine.config --readme-table` prints the README's flag table;
`--update-readme README.md` rewrites it in place.

May import: model, io (the dense-weight modes), cache (the policy names, the budget's inputs), guess (the draft
limits), harness.errors, harness.readme_block (the README's flag table).
"""

from harness.engine.config.fields import SPECS, EngineConfig, Flag, Spec, build_parser
from harness.engine.config.rules import lossy_settings, parse_cli, validate, validate_for_model

__all__ = ["SPECS", "EngineConfig", "Flag", "Spec", "build_parser", "lossy_settings", "parse_cli", "validate",
           "validate_for_model"]
