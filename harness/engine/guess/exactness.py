"""Whether this build of llama.cpp decodes a verify batch bit-exactly as one-token decoding (guess-ahead).

llamafile's sgemm (GGML_LLAMAFILE, on by default in llama.cpp's x86 builds) takes every matmul of two or more
columns, a verify batch's included, and sums each dot product in another order than ggml_vec_dot, which takes the
one-column matmul of a single-token decode: the same position's logits then differ (by up to several units on a
16-layer generated model) and a near-tie can flip. scripts/setup.sh builds without it; llama_print_system_info
says which build is loaded. Two more kernels change with the batch and are avoided at run time: flash attention
(a one-token decode splits the KV over the threads from 512 cells; the session's contexts have it off) and the
tiled K-quant matmul (from 8 rows; a verify batch stays under: MAX_DRAFT). Everything else ggml-cpu runs for
these graphs computes each token's row by itself, in an order that does not depend on the batch.
"""

from __future__ import annotations


def system_info() -> str:
    from harness.formats.partial_import import submodule_alone

    L = submodule_alone("llama_cpp.llama_cpp")  # the ctypes bindings, without the package's __init__
    return L.llama_print_system_info().decode("utf-8", "replace")


def batch_inexact_reason(info: str, flash_attn: str = "off") -> str | None:
    """Why a verify batch would not be bit-exact on the build whose system info is `info` with --flash-attn
    `flash_attn`, or None."""
    if flash_attn != "off":
        return (f"with --flash-attn {flash_attn} a one-token decode splits a KV cache of 512+ cells over the threads "
                "and a verify batch does not: guess-ahead output can differ from plain greedy at a near-tie once "
                "that many tokens are cached; drop --flash-attn for bit-exact output")
    if "LLAMAFILE = 1" in info:
        return ("this llama.cpp is built with llamafile's sgemm (LLAMAFILE = 1), whose batched matmuls round "
                "differently from one-token decoding: guess-ahead output can differ from plain greedy at a near-tie; "
                "rebuild llama-cpp-python with scripts/setup.sh (-DGGML_LLAMAFILE=OFF)")
    return None



# ggml-cpu's tiled K-quant matmul takes a matmul, or one expert of a MUL_MAT_ID, from 8 rows on and sums in another
# order than ggml_vec_dot. Its switch (GGML_CPU_TILED_MM=0) is process-wide and read once, so turning it off for a
# verify batch would change the prompt's prefill too, and the output against plain greedy decoding: a verify batch
# stays under 8 tokens instead (--draft at most MAX_DRAFT).
TILED_MIN_ROWS = 8
MAX_DRAFT = TILED_MIN_ROWS - 2  # the sampled token plus its guesses: at most 7 rows
