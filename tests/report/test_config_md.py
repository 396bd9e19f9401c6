"""findings.md's engine configuration as tables (harness.report.config_md): settings, then what the engine
recorded, one key a row; a value cannot break its row."""

from __future__ import annotations

from harness.report.config_md import LEAD, config_table


def test_settings_then_recorded_one_key_a_row():
    lines = config_table({"arch": "qwen3moe", "cfg.ctx": "256", "engine": "bmoe", "cfg.prompt": "a | b\nc",
                          "units": "ms"})
    assert lines == [LEAD, "",
                     "| setting (`cfg.`) | value |", "|---|---|", "| `ctx` | 256 |", "| `prompt` | a \\| b c |", "",
                     "| recorded | value |", "|---|---|", "| `arch` | qwen3moe |", "| `units` | ms |", ""]


def test_nothing_shared_is_no_table():
    assert config_table({}) == [] and config_table({"engine": "bmoe"}) == []
    assert config_table({"arch": "gemma4"})[2:] == ["| recorded | value |", "|---|---|", "| `arch` | gemma4 |", ""]
