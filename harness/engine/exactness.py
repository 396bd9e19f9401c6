"""Whether this build of llama.cpp decodes a verify batch bit-exactly as one-token decoding (guess-ahead).

llamafile's sgemm (GGML_LLAMAFILE, on by default in llama.cpp's x86 builds) takes every matmul of two or more
columns, a verify batch's included, and sums each dot product in another order than ggml_vec_dot, which takes the
one-column matmul of a single-token decode: the same position's logits then differ (by up to several units on a
16-layer generated model) and a near-tie can flip. scripts/setup.sh builds without it; llama_print_system_info
says which build is loaded. Two more kernels change with the batch and are avoided at run time: flash attention
(a one-token decode splits the KV over the threads from 512 cells; the session's contexts have it off) and the
tiled K-quant matmul (from 8 rows; `pin_batch_kernels`). Everything else ggml-cpu runs for these graphs computes
each token's row by itself, in an order that does not depend on the batch.
"""

from __future__ import annotations

import os


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


TILED_MIN_ROWS = 8  # ggml-cpu's tiled K-quant matmul takes a matmul (or one expert of a MUL_MAT_ID) from 8 rows on


def pin_batch_kernels(batch_tokens: int) -> bool:
    """Keep a verify batch of `batch_tokens` on the kernels one-token decoding uses; True when it changed
    something. A batch of 8 or more could give one expert (or a K-quant dense matmul) 8 rows, which ggml-cpu's
    tiled K-quant matmul takes and sums in another order than ggml_vec_dot: GGML_CPU_TILED_MM=0 turns it off for
    the whole process (ggml reads it once, at the first matmul, so this must run before the first decode); it
    also gives up the tiled kernel's prefill speed on K-quant weights. Shorter batches need nothing."""
    if batch_tokens < TILED_MIN_ROWS or os.environ.get("GGML_CPU_TILED_MM") == "0":
        return False
    os.environ["GGML_CPU_TILED_MM"] = "0"
    return True
