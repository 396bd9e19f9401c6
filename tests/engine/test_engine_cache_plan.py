"""plan_cache in-process: --cache-mb 0|N|auto resolved from the config, the model's sizes and injected memory
readings (no model file, no llama.cpp, no /proc)."""

from __future__ import annotations

import pytest

from harness.engine.cache.budget import AUTO_HEADROOM_MIB, MIB, ExpertSizes, plan_cache
from harness.engine.config import parse_cli
from harness.engine.io.sysstats import MemReading
from harness.errors import UserError

# 4 MoE layers, 8 experts of 1 MiB each per layer; top-2: one token cycle T = 4 x 2 x 1 MiB = 8 MiB
SIZES = ExpertSizes(per_layer=[MIB] * 4, total=4 * 8 * MIB, dense=100 * MIB)
K = 2


def cfg(*flags: str):
    return parse_cli(["-m", "m.gguf", "--moe-stream", *flags]).budget_ask()


def test_zero_is_no_cache():
    p = plan_cache(cfg("--cache-mb", "0"), SIZES, K)
    assert (p.budget_bytes, p.mode, p.cycle_bytes) == (0, "off", 8 * MIB)


def test_fixed_budget_and_the_token_cycle_guard():
    p = plan_cache(cfg("--cache-mb", "8"), SIZES, K)
    assert (p.budget_bytes, p.mode, p.note) == (8 * MIB, "fixed", "fixed 8 MiB")
    with pytest.raises(UserError, match=r"below one token cycle T = 8 MiB.*give at least 8 MiB.*--force-cache"):
        plan_cache(cfg("--cache-mb", "7"), SIZES, K)
    forced = plan_cache(cfg("--cache-mb", "7", "--force-cache"), SIZES, K)
    assert forced.budget_bytes == 7 * MIB and "forced below the token cycle" in forced.note


def test_cycle_follows_k():
    assert plan_cache(cfg("--cache-mb", "0"), SIZES, 4).cycle_bytes == 16 * MIB
    with pytest.raises(UserError, match="T = 16 MiB"):
        plan_cache(cfg("--cache-mb", "8"), SIZES, 4)


def test_auto_from_mem_available_less_dense_and_headroom():
    mem = MemReading(available_mib=380)
    p = plan_cache(cfg(), SIZES, K, mem)
    assert p.mode == "auto"
    assert p.budget_bytes == (380 - 100 - AUTO_HEADROOM_MIB) * MIB  # 24 MiB, under all experts (32)
    assert p.note.startswith("auto: MemAvailable 380 MiB, less dense weights 100 MiB and 256 MiB headroom")
    assert p.note.endswith("-> 24 MiB")


def test_auto_is_capped_by_all_experts():
    p = plan_cache(cfg(), SIZES, K, MemReading(available_mib=16000))
    assert p.budget_bytes == SIZES.total and "capped at all experts (32 MiB)" in p.note


def test_auto_respects_the_ceiling():
    p = plan_cache(cfg("--cache-ceil-mb", "10"), SIZES, K, MemReading(available_mib=16000))
    assert p.budget_bytes == 10 * MIB and "capped by --cache-ceil-mb 10" in p.note


def test_auto_under_a_cgroup_limit_takes_the_smaller():
    tight = MemReading(available_mib=16000, cgroup_limit_bytes=400 * MIB, anon_mib=20)
    p = plan_cache(cfg(), SIZES, K, tight)
    assert p.budget_bytes == (400 - 20 - 100 - AUTO_HEADROOM_MIB) * MIB
    assert "cgroup limit 400 MiB less 20 MiB anon" in p.note
    loose = MemReading(available_mib=370, cgroup_limit_bytes=8000 * MIB, anon_mib=20)
    assert "MemAvailable 370 MiB" in plan_cache(cfg(), SIZES, K, loose).note


def test_auto_without_memory_falls_back_to_no_cache_and_says_so():
    p = plan_cache(cfg(), SIZES, K, MemReading(available_mib=300))
    assert (p.budget_bytes, p.mode) == (0, "auto")
    assert "no memory left for one, so no expert cache (auto falls back to --cache-mb 0" in p.note


def test_auto_below_the_token_cycle_falls_back_to_no_cache():
    p = plan_cache(cfg(), SIZES, K, MemReading(available_mib=360))  # 4 MiB < T
    assert p.budget_bytes == 0
    assert "-> 4 MiB: below one token cycle T = " in p.note and "no expert cache" in p.note


def test_auto_below_the_token_cycle_with_force_cache_keeps_the_budget():
    p = plan_cache(cfg("--force-cache"), SIZES, K, MemReading(available_mib=360))
    assert p.budget_bytes == 4 * MIB and "forced below the token cycle" in p.note


def test_auto_never_picks_a_budget_in_the_448_mib_cliff():
    """The cliff measured under a 448 MiB cap (1.1 GiB qwen3moe, 150 MB dense): 120 MiB of cache ran at
    full speed, 160 MiB fell to a quarter as the dense weights were reclaimed. Auto keeps the headroom, so
    under that cap it picks no cache at all (~100 MiB of anon for the process)."""
    sizes = ExpertSizes(per_layer=[1_000_000] * 12, total=12 * 64 * 1_000_000, dense=150 * MIB)
    p = plan_cache(cfg(), sizes, 6, MemReading(available_mib=16000, cgroup_limit_bytes=448 * MIB, anon_mib=100))
    assert p.budget_bytes == 0


def test_auto_needs_a_reading():
    with pytest.raises(ValueError, match="memory reading"):
        plan_cache(cfg(), SIZES, K)


def test_preload_needs_every_expert():
    assert plan_cache(cfg("--cache-mb", "32", "--cache-preload"), SIZES, K).budget_bytes == 32 * MIB
    with pytest.raises(UserError, match=r"--cache-preload needs a budget of every expert, 32 MiB; the budget is 31"):
        plan_cache(cfg("--cache-mb", "31", "--cache-preload"), SIZES, K)
