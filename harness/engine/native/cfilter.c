/* bmoe: a C front for llama.cpp's cb_eval that answers the scheduler's "ask" calls for ordinary graph
 * nodes itself (a few ns each) and calls the Python hook only for the nodes it cares about: MUL_MAT_ID
 * nodes (their src[0] may be a routed-expert tensor), the router's top-k node, and every non-ask call.
 * Tensor field offsets come from the Python side (harness/engine/model/ggml.py), so this file has no copy of
 * ggml's headers. Loaded with ctypes; the pure-Python callback is the fallback when it is not built. */
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

typedef bool (*bmoe_cb_t)(void *t, bool ask, void *ud);

struct bmoe_filter {
    bmoe_cb_t py;          /* the Python hook */
    int64_t off_op;        /* offsetof(struct ggml_tensor, op) */
    int64_t off_name;      /* offsetof(struct ggml_tensor, name) */
    int32_t op_mul_mat_id;
    int32_t op_view;
    int32_t op_top_k;
    int32_t prefix_len;
    char prefix[32];       /* e.g. "ffn_moe_topk-" */
    int64_t asks;          /* asks answered here (telemetry) */
    int64_t forwarded;     /* calls passed to Python */
    int32_t forward_all;   /* pass every ask to Python (while the dense weights are being rebound) */
    int32_t op_get_rows;   /* a top-k node may also be a GET_ROWS (selection by token id: deepseek4) */
    int32_t wprefix_len;   /* v4: also pass asks of nodes named wprefix... to Python (0 = none) */
    char wprefix[32];      /* e.g. "ffn_moe_weights" (router weights: --drop-cold-experts, route traces) */
};

/* 2: forward_all; 3 (never on main): GET_ROWS top-k or weights nodes, each alone; 4: both fields */
int bmoe_filter_version(void) { return 4; }

bool bmoe_filter_cb(void *t, bool ask, void *ud) {
    struct bmoe_filter *f = (struct bmoe_filter *)ud;
    if (ask && !f->forward_all) {
        int32_t op = *(const int32_t *)((const char *)t + f->off_op);
        if (op == f->op_mul_mat_id) {
            f->forwarded++;
            return f->py(t, ask, 0);
        }
        if (op == f->op_view || op == f->op_top_k || op == f->op_get_rows) {
            const char *name = (const char *)t + f->off_name;
            if (strncmp(name, f->prefix, (size_t)f->prefix_len) == 0) {
                f->asks++;
                return true; /* isolate the router's top-k: Python reads it in the non-ask call */
            }
        }
        if (f->wprefix_len > 0) {
            const char *name = (const char *)t + f->off_name;
            if (strncmp(name, f->wprefix, (size_t)f->wprefix_len) == 0) {
                f->forwarded++;
                return f->py(t, ask, 0);
            }
        }
        f->asks++;
        return false;
    }
    f->forwarded++;
    return f->py(t, ask, 0);
}
