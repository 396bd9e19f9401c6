"""findings.md's engine configuration shared by every run, as tables a person can scan (pure: the preamble keys
in, markdown out): the settings the engine resolved from its flags (the preamble's `cfg.*` keys), then what it
recorded about the model, the machine and its own build, one key a row, in the preamble's order."""

from __future__ import annotations

SETTING = "cfg."
LEAD = "Engine configuration shared by every run (CSV preambles):"


def _cell(v: object) -> str:
    """A value as one table cell: a `|` or a line break would end the cell or the row."""
    return str(v).replace("\\", "\\\\").replace("|", "\\|").replace("\r", " ").replace("\n", " ")


def _table(head: tuple[str, str], rows: list[tuple[str, str]]) -> list[str]:
    return [f"| {head[0]} | {head[1]} |", "|---|---|", *(f"| `{k}` | {_cell(v)} |" for k, v in rows)]


def config_table(fixed: dict[str, str]) -> list[str]:
    """The lines of the two tables (settings, then recorded facts), led by one line; [] when nothing is shared.
    The `engine` key is left out: the Setup's Engine line names it."""
    items = [(k, v) for k, v in fixed.items() if k != "engine"]
    if not items:
        return []
    settings = [(k[len(SETTING):], v) for k, v in items if k.startswith(SETTING)]
    facts = [(k, v) for k, v in items if not k.startswith(SETTING)]
    out = [LEAD, ""]
    if settings:
        out += _table(("setting (`cfg.`)", "value"), settings) + [""]
    if facts:
        out += _table(("recorded", "value"), facts) + [""]
    return out
