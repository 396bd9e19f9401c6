"""The architectures whose module gives its own keys (`kvs`) and complete tensor list (`tensors`), exactly what
llama.cpp's loader for that arch creates; plan.py appends the keys to the common ones. One entry per arch."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from harness.synth.archs import (
    bailingmoe2,
    bailingmoe3,
    deepseek2,
    deepseek4,
    dots1,
    ernie4_5_moe,
    gemma4,
    glm4moe,
    granitemoe,
    hunyuan_moe,
    llama,
)
from harness.synth.gguf_encode import KV
from harness.synth.spec import ModelSpec
from harness.synth.tensors import TensorPlan


@dataclass(frozen=True)
class ArchLayout:
    kvs: Callable[[ModelSpec], list[KV]]
    tensors: Callable[[ModelSpec], list[TensorPlan]]


LAYOUTS: dict[str, ArchLayout] = {
    "granitemoe": ArchLayout(granitemoe.kvs, granitemoe.tensors),
    "llama": ArchLayout(llama.kvs, llama.tensors),
    "deepseek2": ArchLayout(deepseek2.kvs, deepseek2.tensors),
    "glm4moe": ArchLayout(glm4moe.kvs, glm4moe.tensors),
    "ernie4_5-moe": ArchLayout(ernie4_5_moe.kvs, ernie4_5_moe.tensors),
    "hunyuan-moe": ArchLayout(hunyuan_moe.kvs, hunyuan_moe.tensors),
    "dots1": ArchLayout(dots1.kvs, dots1.tensors),
    "bailingmoe2": ArchLayout(bailingmoe2.kvs, bailingmoe2.tensors),
    "gemma4": ArchLayout(gemma4.kvs, gemma4.tensors),
    "deepseek4": ArchLayout(deepseek4.kvs, deepseek4.tensors),
    "bailingmoe3": ArchLayout(bailingmoe3.kvs, bailingmoe3.tensors),
}
