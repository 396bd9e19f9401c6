"""The compiled callback front (cfilter.c), loaded with ctypes: it answers the scheduler's asks for ordinary
graph nodes itself and calls the Python hook only for the nodes it cares about (MUL_MAT_ID nodes, the routing
node, with `wprefix` the router-weights nodes, with `forward_all` every ask) and for every non-ask call."""

from __future__ import annotations

import ctypes

from harness.engine import native
from harness.engine.model.ggml import (
    GGML_OP_GET_ROWS,
    GGML_OP_MUL_MAT_ID,
    GGML_OP_TOP_K,
    GGML_OP_VIEW,
    OFF_NAME,
    OFF_OP,
)
from harness.engine.stream.weights import PREFIX as WEIGHTS_PREFIX

FILTER_VERSION = 2  # cfilter.c's bmoe_filter_version(): 2 has forward_all
GET_ROWS_VERSION = 4  # 4 also isolates a GET_ROWS top-k node (selection by token id)
FILTER_VERSION_WEIGHTS = 4  # 4 also forwards the router-weights nodes (wprefix)
STALE = "stale"  # load_filter: the built library is older than this file needs


class _Filter(ctypes.Structure):
    _fields_ = [("py", ctypes.c_void_p), ("off_op", ctypes.c_int64), ("off_name", ctypes.c_int64),
                ("op_mul_mat_id", ctypes.c_int32), ("op_view", ctypes.c_int32), ("op_top_k", ctypes.c_int32),
                ("prefix_len", ctypes.c_int32), ("prefix", ctypes.c_char * 32), ("asks", ctypes.c_int64),
                ("forwarded", ctypes.c_int64), ("forward_all", ctypes.c_int32), ("op_get_rows", ctypes.c_int32),
                ("wprefix_len", ctypes.c_int32), ("wprefix", ctypes.c_char * 32)]


def load_filter(py_cfunc, prefix: bytes, forward_all: bool = False, get_rows_topk: bool = False,
                weights: bool = False):
    """The compiled C front (cfilter.c), or None when it was not built (then Python answers every ask), or
    STALE when `forward_all`, a GET_ROWS top-k node or `weights` (forward the router-weights nodes) is needed
    and the built library predates it."""
    path = native.library("cfilter")
    if path is None:
        return None
    lib = ctypes.CDLL(path)
    lib.bmoe_filter_cb.restype = ctypes.c_bool
    version = lib.bmoe_filter_version() if hasattr(lib, "bmoe_filter_version") else 1
    if ((forward_all and version < FILTER_VERSION) or (get_rows_topk and version < GET_ROWS_VERSION)
            or (weights and version < FILTER_VERSION_WEIGHTS)):
        return STALE
    f = _Filter()
    f.py = ctypes.cast(py_cfunc, ctypes.c_void_p).value
    f.off_op, f.off_name = OFF_OP, OFF_NAME
    f.op_mul_mat_id, f.op_view, f.op_top_k = GGML_OP_MUL_MAT_ID, GGML_OP_VIEW, GGML_OP_TOP_K
    f.prefix_len = len(prefix)
    f.prefix = prefix
    f.forward_all = int(forward_all)
    f.op_get_rows = GGML_OP_GET_ROWS if version >= GET_ROWS_VERSION else -1
    if weights:
        f.wprefix_len = len(WEIGHTS_PREFIX)
        f.wprefix = WEIGHTS_PREFIX
    return lib, f
