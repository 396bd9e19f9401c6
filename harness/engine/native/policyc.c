/* The cache policies' bookkeeping, compiled: harness.engine.native._policyc, an optional extension (setup.py).
   harness/engine/cache/policies/*.py hold the reference (pure Python and numpy), which runs when this is not
   built or with BMOE_PURE_PYTHON_POLICIES=1; harness/engine/cache/policies/native.py picks. Every decision is
   the reference's, bit for bit (tests/engine/test_cache_decisions.py, tests/engine/test_policy_impls.py):
   - the Markov policies' per-batch arithmetic (learn, ratio, since, duel_step, duel_scores): each numpy
     expression element for element in the same precision (float32 where the reference is float32,
     float64 where it is float64), summed in numpy's order (a reduction over axis 0 of a C-contiguous
     array adds the rows one after the other). The log2 calls stay in numpy (its SIMD log2 differs from
     libm's in the last bit), so the caller runs them between these functions;
   - markov-duel's close after its one numpy log2 (duel_close, policyc_duel.c): the staleness's log2 from a
     table numpy computed (the argument is a whole number 1..64), the duel step, the scores and their push;
   - ExpertCache's loops (lookup, evict; policyc_lookup.c): the per-expert lookup and the eviction loop of
     harness/engine/cache/expert_cache.py, calling the policy's methods in the same order with the same arguments;
   - LayerHeaps and MinHeap, the score heaps (heaps.py): the same victims and peeks;
   - AgedCore, the per-lookup state of aged, aged-decay, aged-markov (and markov-duel's, duel mode): the
     cache calls it directly; Python floats' arithmetic is libm's pow and log2, in the same order.
   Built with -ffp-contract=off: no fused multiply-add, every product rounded on its own. Arrays come
   through the buffer protocol (no numpy headers), C-contiguous, of the dtypes the reference keeps:
   counts float32, last-use tokens float64, indices intp. */

#include "policyc.h"

void buf_release(Buf *b) {
    if (b->held) {
        if (b->own) {
            PyMem_Free(b->own);
            b->own = NULL;
        } else {
            PyBuffer_Release(&b->v);
        }
        b->held = 0;
    }
}

/* an index list (of int) as a read-only 'i' buffer: a C copy */
static int buf_from_list(PyObject *o, Buf *b, const char *what) {
    Py_ssize_t n = PyList_GET_SIZE(o);
    b->own = PyMem_Malloc(sizeof(Py_ssize_t) * (size_t)(n ? n : 1));
    if (!b->own) {
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        b->own[i] = PyLong_AsSsize_t(PyList_GET_ITEM(o, i));
        if (b->own[i] == -1 && PyErr_Occurred()) {
            PyMem_Free(b->own);
            b->own = NULL;
            PyErr_Format(PyExc_TypeError, "%s: a list of int is needed", what);
            return -1;
        }
    }
    memset(&b->v, 0, sizeof(b->v));
    b->v.buf = b->own;
    b->v.len = n * (Py_ssize_t)sizeof(Py_ssize_t);
    b->v.itemsize = sizeof(Py_ssize_t);
    b->v.ndim = 1;
    b->held = 1;
    return 0;
}

/* kind: 'f' float32, 'd' float64, 'i' intp (8 bytes; read-only, also a list of int) */
int buf_get(PyObject *o, Buf *b, char kind, int writable, const char *what) {
    int flags = PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | (writable ? PyBUF_WRITABLE : 0);
    b->held = 0;
    b->own = NULL;
    if (kind == 'i' && !writable && PyList_Check(o))
        return buf_from_list(o, b, what);
    if (PyObject_GetBuffer(o, &b->v, flags) < 0)
        return -1;
    b->held = 1;
    const char *f = b->v.format ? b->v.format : "B";
    if (*f == '<' || *f == '=' || *f == '@')
        f++;
    int ok;
    if (kind == 'f')
        ok = b->v.itemsize == 4 && f[0] == 'f' && f[1] == 0;
    else if (kind == 'd')
        ok = b->v.itemsize == 8 && f[0] == 'd' && f[1] == 0;
    else
        ok = b->v.itemsize == 8 && (f[0] == 'l' || f[0] == 'q') && f[1] == 0;
    if (!ok) {
        PyErr_Format(PyExc_TypeError, "%s: wrong dtype (format %s)", what, f);
        buf_release(b);
        return -1;
    }
    return 0;
}

int check_idx(const Py_ssize_t *idx, Py_ssize_t n, Py_ssize_t size, const char *what) {
    for (Py_ssize_t i = 0; i < n; i++)
        if (idx[i] < 0 || idx[i] >= size) {
            PyErr_Format(PyExc_IndexError, "%s: index %zd out of 0..%zd", what, idx[i], size - 1);
            return -1;
        }
    return 0;
}

static PyMethodDef methods[] = {
    {"learn", learn, METH_VARARGS, "MarkovModel.close's count updates."},
    {"ratio", ratio, METH_VARARGS, "use rate q and P / q (before the log2) of MarkovModel.log_ratio."},
    {"since", since, METH_VARARGS, "markov-duel's staleness and its log2 argument."},
    {"duel_step", duel_step, METH_VARARGS, "markov-duel's candidate hits (False: a tie, run numpy)."},
    {"duel_close", duel_close, METH_VARARGS, "markov-duel's close after its log2s (-1: take numpy's path)."},
    {"evict", evict, METH_VARARGS, "ExpertCache.evict_over_budget's loop."},
    {"lookup", lookup, METH_VARARGS, "ExpertCache.lookup_batch's loop over a layer batch."},
    {"duel_scores", duel_scores, METH_VARARGS, "markov-duel's candidate scores and the resident entries'."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_policyc", "Markov policies' arithmetic, compiled.",
                                    -1, methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__policyc(void) {
    if (PyType_Ready(&LayerHeapsType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (!m)
        return NULL;
    if (PyType_Ready(&AgedCoreType) < 0 || PyType_Ready(&MinHeapType) < 0)
        return NULL;
    Py_INCREF(&LayerHeapsType);
    if (PyModule_AddObject(m, "LayerHeaps", (PyObject *)&LayerHeapsType) < 0) {
        Py_DECREF(&LayerHeapsType);
        Py_DECREF(m);
        return NULL;
    }
    Py_INCREF(&MinHeapType);
    if (PyModule_AddObject(m, "MinHeap", (PyObject *)&MinHeapType) < 0) {
        Py_DECREF(&MinHeapType);
        Py_DECREF(m);
        return NULL;
    }
    Py_INCREF(&AgedCoreType);
    if (PyModule_AddObject(m, "AgedCore", (PyObject *)&AgedCoreType) < 0) {
        Py_DECREF(&AgedCoreType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
