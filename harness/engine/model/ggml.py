"""ctypes mirror of `struct ggml_tensor` and the few ggml enums the hook needs.

Follows vendor/llama.cpp/ggml/include/ggml.h of llama-cpp-python 0.3.36 (pinned in pyproject.toml):
GGML_MAX_DIMS 4, GGML_MAX_OP_PARAMS 64, GGML_MAX_SRC 10, GGML_MAX_NAME 64. A version bump must re-check
this file; tests/engine/test_hook_fastpath.py checks the routing node view against numpy.
"""

from __future__ import annotations

import ctypes

GGML_MAX_DIMS = 4
GGML_MAX_OP_PARAMS = 64
GGML_MAX_SRC = 10
GGML_MAX_NAME = 64

# enum ggml_op (subset)
GGML_OP_NONE = 0
GGML_OP_MUL_MAT_ID = 30
GGML_OP_VIEW = 37
GGML_OP_GET_ROWS = 40  # deepseek4's hash-routed layers: ffn_moe_topk is a GET_ROWS of the token -> experts table
GGML_OP_ARGSORT = 69
GGML_OP_TOP_K = 70

# enum ggml_type (subset)
GGML_TYPE_F32 = 0
GGML_TYPE_F16 = 1
GGML_TYPE_I32 = 26


class GgmlTensor(ctypes.Structure):
    _fields_ = [
        ("type", ctypes.c_int),
        ("buffer", ctypes.c_void_p),
        ("ne", ctypes.c_int64 * GGML_MAX_DIMS),
        ("nb", ctypes.c_size_t * GGML_MAX_DIMS),
        ("op", ctypes.c_int),
        ("op_params", ctypes.c_int32 * (GGML_MAX_OP_PARAMS // 4)),
        ("flags", ctypes.c_int32),
        ("src", ctypes.c_void_p * GGML_MAX_SRC),
        ("view_src", ctypes.c_void_p),
        ("view_offs", ctypes.c_size_t),
        ("data", ctypes.c_void_p),
        ("name", ctypes.c_char * GGML_MAX_NAME),
        ("extra", ctypes.c_void_p),
        ("padding", ctypes.c_char * 8),
    ]


OFF_OP = GgmlTensor.op.offset
OFF_SRC0 = GgmlTensor.src.offset
OFF_DATA = GgmlTensor.data.offset
OFF_VIEW_SRC = GgmlTensor.view_src.offset
OFF_VIEW_OFFS = GgmlTensor.view_offs.offset
OFF_NAME = GgmlTensor.name.offset


def tensor_at(addr: int) -> GgmlTensor:
    return GgmlTensor.from_address(addr)


def op_at(addr: int) -> int:
    return ctypes.c_int.from_address(addr + OFF_OP).value


def src0_at(addr: int) -> int:
    return ctypes.c_void_p.from_address(addr + OFF_SRC0).value or 0


def name_at(addr: int) -> str:
    return ctypes.string_at(addr + OFF_NAME).decode("utf-8", "replace")
