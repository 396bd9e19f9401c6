"""Greedy text straight through llama.cpp (llama-cpp-python), no bmoe: what a generated model says on its own."""

from __future__ import annotations

from pathlib import Path

import pytest

PROMPT = b"The quick brown fox jumps over the lazy dog."


def greedy(path: Path, n: int = 16, prompt: bytes = PROMPT, n_ctx: int = 128) -> list[int]:
    llama_cpp = pytest.importorskip("llama_cpp")
    llm = llama_cpp.Llama(model_path=str(path), n_ctx=n_ctx, verbose=False)
    out: list[int] = []
    for tok in llm.generate(llm.tokenize(prompt), temp=0.0, top_k=1):
        out.append(tok)
        if len(out) == n:
            break
    llm.close()
    return out
