"""Synthetic layouts of the architectures that have a module of their own here: each module gives the arch's own
metadata keys (`kvs`, appended to the common ones in plan.py) and its complete tensor list (`tensors`), exactly
what llama.cpp's loader for that arch creates. One entry per arch below."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from harness.synth.archs import bailingmoe3, deepseek4, gemma4
from harness.synth.gguf_encode import KV
from harness.synth.spec import ModelSpec
from harness.synth.tensors import TensorPlan


@dataclass(frozen=True)
class ArchLayout:
    kvs: Callable[[ModelSpec], list[KV]]
    tensors: Callable[[ModelSpec], list[TensorPlan]]


LAYOUTS: dict[str, ArchLayout] = {
    "gemma4": ArchLayout(gemma4.kvs, gemma4.tensors),
    "deepseek4": ArchLayout(deepseek4.kvs, deepseek4.tensors),
    "bailingmoe3": ArchLayout(bailingmoe3.kvs, bailingmoe3.tensors),
}
