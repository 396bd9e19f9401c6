"""The writer takes llama-quantize's fallback for expert down rows no multiple of a k-quant's 256 (as a converted,
quantized file of that shape has: docs/real-toolchain.md), and still refuses what it has no generator for."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from gguf import GGUFReader

from harness.errors import UserError
from harness.synth import ModelSpec, make_model, plan_model


@pytest.mark.parametrize(("expert_type", "gate", "down"), [("q4_k", "Q4_K", "Q5_0"), ("q6_k", "Q6_K", "Q8_0")])
def test_down_rows_of_128_fall_back_as_llama_quantize(tmp_path: Path, expert_type: str, gate: str, down: str) -> None:
    spec = ModelSpec(n_layer=2, n_ff_exp=128, expert_type=expert_type, seed=3)
    types = {t.name: t.tensor_type.name for t in GGUFReader(make_model(tmp_path / "m.gguf", spec)[0]).tensors}
    assert types["blk.0.ffn_gate_exps.weight"] == types["blk.1.ffn_up_exps.weight"] == gate
    assert types["blk.0.ffn_down_exps.weight"] == types["blk.1.ffn_down_exps.weight"] == down


def test_no_fallback_where_rows_fit_and_q5_k_still_refused() -> None:
    assert ModelSpec(n_ff_exp=256, expert_type="q4_k").down_type == "q4_k"
    assert ModelSpec(n_ff_exp=128, expert_type="q4_k", expert_down_type="q8_0").down_type == "q8_0"
    with pytest.raises(UserError, match="--expert-ff"):  # llama-quantize's q5_1: no generator here
        plan_model(dataclasses.replace(ModelSpec(), n_ff_exp=128, expert_type="q5_k"))
