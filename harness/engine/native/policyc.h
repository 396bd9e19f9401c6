/* Declarations shared by the files of harness.engine.native._policyc (see policyc.c). */

#ifndef BMOE_POLICYC_H
#define BMOE_POLICYC_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <string.h>

/* a held buffer of a C-contiguous array */
typedef struct {
    Py_buffer v;
    int held;
    Py_ssize_t *own; /* an index list's copy (kind 'i' from a list of int), freed by buf_release */
} Buf;

void buf_release(Buf *b);
int buf_get(PyObject *o, Buf *b, char kind, int writable, const char *what);
static inline Py_ssize_t buf_len(Buf *b) { return b->v.len / b->v.itemsize; }
int check_idx(const Py_ssize_t *idx, Py_ssize_t n, Py_ssize_t size, const char *what);

/* policyc_markov.c: the Markov policies' per-batch arithmetic */
PyObject *learn(PyObject *self, PyObject *args);
PyObject *ratio(PyObject *self, PyObject *args);
PyObject *since(PyObject *self, PyObject *args);
PyObject *duel_step(PyObject *self, PyObject *args);
PyObject *duel_scores(PyObject *self, PyObject *args);
PyObject *duel_close(PyObject *self, PyObject *args); /* policyc_duel.c */
int duel_rows(double *base, Py_ssize_t n, Buf *bidx, double w1, Buf *lr, double w4, double *c, Py_ssize_t na,
              const double *ages, const double *since);

/* policyc_lookup.c: ExpertCache.lookup_batch's loop */
PyObject *lookup(PyObject *self, PyObject *args);
PyObject *evict(PyObject *self, PyObject *args);

/* policyc_heaps.c: LayerHeaps */
typedef struct {
    double *score;
    long long *tie;
    unsigned char *live;
    Py_ssize_t cap, nlive, head; /* head: the lowest live expert, -1 none; -2 not known (dirty) */
} Layer;

typedef struct {
    PyObject_HEAD
    Layer *layers;
    Py_ssize_t n;
    long long tie;
    PyObject *prot;      /* the protected set the mask was built from (a strong reference) */
    Py_ssize_t prot_layer;
    unsigned char *mask; /* protected experts of prot_layer */
    Py_ssize_t mask_len;
} LayerHeapsObject;

extern PyTypeObject LayerHeapsType;
int lh_key(LayerHeapsObject *self, PyObject *key, Py_ssize_t *layer, Py_ssize_t *e);
int lh_set(LayerHeapsObject *self, Py_ssize_t layer, Py_ssize_t e, double score);
PyObject *lh_discard(LayerHeapsObject *self, PyObject *key);
PyObject *lh_victim_c(LayerHeapsObject *self, Py_ssize_t cur, PyObject *protected, const double *base, double phase);

/* policyc_core.c: AgedCore; policyc_minheap.c: MinHeap */
extern PyTypeObject AgedCoreType;
extern PyTypeObject MinHeapType;

#endif
