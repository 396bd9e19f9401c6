"""The seed search for the architectures' gate models (tests/helpers/arch_seeds.py): seeds and ranges parsed, the
gates' own criterion for a usable reference, and one real resident run of a gate's model."""

from __future__ import annotations

import pytest

from tests.helpers.arch_seeds import main, parse_seeds, verdict
from tests.helpers.arch_specs import ARCH_SPECS, N


def test_seeds_and_ranges_in_the_order_given() -> None:
    assert parse_seeds(["32", "40-42", "7"]) == [32, 40, 41, 42, 7]
    for bad in ("5-3", "x", "1-", "-2"):
        with pytest.raises(ValueError):
            parse_seeds([bad])


def test_the_gates_criterion() -> None:
    assert verdict(0, [205, 220, 146, 160, 49, 8, 8, 8, 8, 8, 8, 8]) == "degenerate"  # granitemoe seed 32 on arm64
    assert verdict(0, list(range(N // 2)) + [0] * (N - N // 2)) == "degenerate"
    assert verdict(0, list(range(N // 2 + 1)) + [0] * (N - N // 2 - 1)) == "ok"
    assert verdict(0, list(range(N - 1))) == "stopped early"
    assert verdict(3, []) == "failed (exit 3)"


def test_a_bad_seed_is_a_usage_error(capsys) -> None:
    with pytest.raises(SystemExit) as e:
        main(["olmoe", "9-1"])
    assert e.value.code == 2 and "not a seed or a range" in capsys.readouterr().err


@pytest.mark.engine
def test_the_gate_models_own_seed_is_accepted(capsys) -> None:
    seed = ARCH_SPECS["olmoe"].seed
    assert main(["olmoe", str(seed)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith(f"seed {seed}: ok, ") and out[-1] == f"accepted: {seed}", out
