"""Whether this build of llama.cpp decodes a verify batch bit-exactly as one-token decoding (guess-ahead).

llamafile's sgemm (GGML_LLAMAFILE, on by default in llama.cpp's x86 builds) takes every matmul of two or more
columns, a verify batch's included, and sums each dot product in another order than ggml_vec_dot, which takes the
one-column matmul of a single-token decode: the same position's logits then differ (by up to several units on a
16-layer generated model) and a near-tie can flip. scripts/setup.sh builds without it; llama_print_system_info
says which build is loaded.
"""

from __future__ import annotations


def system_info() -> str:
    from llama_cpp import llama_cpp as L

    return L.llama_print_system_info().decode("utf-8", "replace")


def batch_inexact_reason(info: str) -> str | None:
    """Why a verify batch would not be bit-exact on the build whose system info is `info`, or None."""
    if "LLAMAFILE = 1" in info:
        return ("this llama.cpp is built with llamafile's sgemm (LLAMAFILE = 1), whose batched matmuls round "
                "differently from one-token decoding: guess-ahead output can differ from plain greedy at a near-tie; "
                "rebuild llama-cpp-python with scripts/setup.sh (-DGGML_LLAMAFILE=OFF)")
    return None
