#include "policyc.h"

/* MinHeap: heaps.py's LazyMinHeap for (layer, expert) keys, compiled (lfu, layer-lfu; see policyc.c).
   A binary heap of (score, tie, key) with stale entries skipped on peek; each key's live (score, tie)
   in per-layer arrays. peek returns the live key with the lowest (score, tie) not in `protected`: the
   ties are the cache's clock (unique), so that is one entry, as the Python heap finds it. */

typedef struct {
    double score;
    long long tie;
    Py_ssize_t layer, e;
} HEnt;

typedef struct {
    double *score;
    long long *tie;
    unsigned char *live, *prot;
    Py_ssize_t cap;
} HLayer;

typedef struct {
    PyObject_HEAD
    HEnt *h;
    Py_ssize_t len, hcap, nlive, nl;
    HLayer *layers;
    PyObject *prot;   /* the set the prot marks were made from (a strong reference) */
    HEnt *marked;     /* the marked keys, to clear them */
    Py_ssize_t nmarked, mcap;
} MinHeapObject;

static void mh_dealloc(MinHeapObject *self) {
    for (Py_ssize_t i = 0; i < self->nl; i++) {
        free(self->layers[i].score); free(self->layers[i].tie); free(self->layers[i].live); free(self->layers[i].prot);
    }
    free(self->layers); free(self->h); free(self->marked);
    Py_XDECREF(self->prot);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int mh_key(PyObject *key, Py_ssize_t *layer, Py_ssize_t *e) {
    if (!PyTuple_Check(key) || PyTuple_GET_SIZE(key) != 2) {
        PyErr_SetString(PyExc_TypeError, "MinHeap: a key is a (layer, expert) tuple");
        return -1;
    }
    *layer = PyLong_AsSsize_t(PyTuple_GET_ITEM(key, 0));
    if (*layer == -1 && PyErr_Occurred())
        return -1;
    *e = PyLong_AsSsize_t(PyTuple_GET_ITEM(key, 1));
    if (*e == -1 && PyErr_Occurred())
        return -1;
    if (*layer < 0 || *e < 0) {
        PyErr_Format(PyExc_IndexError, "MinHeap: key (%zd, %zd) out of range", *layer, *e);
        return -1;
    }
    return 0;
}

/* the layer's arrays, grown to hold expert e (grow=0: NULL when they do not) */
static HLayer *mh_layer(MinHeapObject *self, Py_ssize_t layer, Py_ssize_t e, int grow) {
    if (layer >= self->nl) {
        if (!grow)
            return NULL;
        Py_ssize_t nl = self->nl ? self->nl : 8;
        while (nl <= layer)
            nl *= 2;
        HLayer *g = realloc(self->layers, sizeof(HLayer) * (size_t)nl);
        if (!g) {
            PyErr_NoMemory();
            return NULL;
        }
        memset(g + self->nl, 0, sizeof(HLayer) * (size_t)(nl - self->nl));
        self->layers = g;
        self->nl = nl;
    }
    HLayer *L = &self->layers[layer];
    if (e >= L->cap) {
        if (!grow)
            return NULL;
        Py_ssize_t cap = L->cap ? L->cap : 8;
        while (cap <= e)
            cap *= 2;
        double *s = realloc(L->score, sizeof(double) * (size_t)cap);
        if (s) L->score = s;
        long long *t = realloc(L->tie, sizeof(long long) * (size_t)cap);
        if (t) L->tie = t;
        unsigned char *l = realloc(L->live, (size_t)cap);
        if (l) L->live = l;
        unsigned char *p = realloc(L->prot, (size_t)cap);
        if (p) L->prot = p;
        if (!s || !t || !l || !p) {
            PyErr_NoMemory();
            return NULL;
        }
        memset(L->live + L->cap, 0, (size_t)(cap - L->cap));
        memset(L->prot + L->cap, 0, (size_t)(cap - L->cap));
        L->cap = cap;
    }
    return L;
}

static int hless(const HEnt *a, const HEnt *b) {
    return a->score < b->score || (a->score == b->score && a->tie < b->tie);
}

static void h_up(HEnt *h, Py_ssize_t i) {
    HEnt x = h[i];
    while (i > 0) {
        Py_ssize_t p = (i - 1) / 2;
        if (!hless(&x, &h[p]))
            break;
        h[i] = h[p];
        i = p;
    }
    h[i] = x;
}

static void h_down(HEnt *h, Py_ssize_t n, Py_ssize_t i) {
    HEnt x = h[i];
    for (;;) {
        Py_ssize_t c = 2 * i + 1;
        if (c >= n)
            break;
        if (c + 1 < n && hless(&h[c + 1], &h[c]))
            c++;
        if (!hless(&h[c], &x))
            break;
        h[i] = h[c];
        i = c;
    }
    h[i] = x;
}

static int h_push(MinHeapObject *self, HEnt x) {
    if (self->len == self->hcap) {
        Py_ssize_t cap = self->hcap ? 2 * self->hcap : 64;
        HEnt *g = realloc(self->h, sizeof(HEnt) * (size_t)cap);
        if (!g) {
            PyErr_NoMemory();
            return -1;
        }
        self->h = g;
        self->hcap = cap;
    }
    self->h[self->len] = x;
    h_up(self->h, self->len++);
    return 0;
}

static HEnt h_pop(MinHeapObject *self) {
    HEnt top = self->h[0];
    self->h[0] = self->h[--self->len];
    if (self->len)
        h_down(self->h, self->len, 0);
    return top;
}

static int h_stale(MinHeapObject *self, const HEnt *x) {
    HLayer *L = mh_layer(self, x->layer, x->e, 0);
    return !L || !L->live[x->e] || L->score[x->e] != x->score || L->tie[x->e] != x->tie;
}

static PyObject *mh_set(MinHeapObject *self, PyObject *args) {
    PyObject *key;
    double score;
    long long tie;
    Py_ssize_t layer, e;
    if (!PyArg_ParseTuple(args, "OdL", &key, &score, &tie) || mh_key(key, &layer, &e))
        return NULL;
    HLayer *L = mh_layer(self, layer, e, 1);
    if (!L)
        return NULL;
    if (!L->live[e]) {
        L->live[e] = 1;
        self->nlive++;
    }
    L->score[e] = score;
    L->tie[e] = tie;
    HEnt x = {score, tie, layer, e};
    if (h_push(self, x) < 0)
        return NULL;
    if (self->len > 4 * self->nlive + 64) { /* compact: only the live entries */
        Py_ssize_t n = 0;
        for (Py_ssize_t i = 0; i < self->len; i++)
            if (!h_stale(self, &self->h[i]))
                self->h[n++] = self->h[i];
        self->len = n;
        for (Py_ssize_t i = n / 2 - 1; i >= 0; i--)
            h_down(self->h, n, i);
    }
    Py_RETURN_NONE;
}

static PyObject *mh_discard(MinHeapObject *self, PyObject *key) {
    Py_ssize_t layer, e;
    if (mh_key(key, &layer, &e))
        return NULL;
    HLayer *L = mh_layer(self, layer, e, 0);
    if (L && L->live[e]) {
        L->live[e] = 0;
        self->nlive--;
    }
    Py_RETURN_NONE;
}

static int mh_mark(MinHeapObject *self, PyObject *protected) {
    if (self->prot == protected)
        return 0;
    for (Py_ssize_t i = 0; i < self->nmarked; i++) {
        HLayer *L = mh_layer(self, self->marked[i].layer, self->marked[i].e, 0);
        if (L)
            L->prot[self->marked[i].e] = 0;
    }
    self->nmarked = 0;
    Py_XDECREF(self->prot);
    self->prot = NULL;
    PyObject *it = PyObject_GetIter(protected), *item;
    if (!it)
        return -1;
    while ((item = PyIter_Next(it))) {
        Py_ssize_t l, e;
        int bad = mh_key(item, &l, &e);
        Py_DECREF(item);
        if (bad) {
            PyErr_Clear(); /* not a key of the heap's: it protects nothing */
            continue;
        }
        HLayer *L = mh_layer(self, l, e, 1);
        if (!L) {
            Py_DECREF(it);
            return -1;
        }
        if (self->nmarked == self->mcap) {
            Py_ssize_t cap = self->mcap ? 2 * self->mcap : 64;
            HEnt *g = realloc(self->marked, sizeof(HEnt) * (size_t)cap);
            if (!g) {
                Py_DECREF(it);
                PyErr_NoMemory();
                return -1;
            }
            self->marked = g;
            self->mcap = cap;
        }
        HEnt m = {0.0, 0, l, e};
        self->marked[self->nmarked++] = m;
        L->prot[e] = 1;
    }
    Py_DECREF(it);
    if (PyErr_Occurred())
        return -1;
    Py_INCREF(protected);
    self->prot = protected;
    return 0;
}

static PyObject *mh_peek(MinHeapObject *self, PyObject *protected) {
    if (mh_mark(self, protected) < 0)
        return NULL;
    HEnt *skipped = NULL;
    Py_ssize_t ns = 0, scap = 0;
    PyObject *ret = NULL;
    int found = 0;
    HEnt top = {0.0, 0, 0, 0};
    while (self->len) {
        HEnt x = self->h[0];
        if (h_stale(self, &x)) {
            h_pop(self);
            continue;
        }
        if (self->layers[x.layer].prot[x.e]) {
            if (ns == scap) {
                scap = scap ? 2 * scap : 16;
                HEnt *g = realloc(skipped, sizeof(HEnt) * (size_t)scap);
                if (!g) {
                    PyErr_NoMemory();
                    goto done;
                }
                skipped = g;
            }
            skipped[ns++] = h_pop(self);
            continue;
        }
        top = x;
        found = 1;
        break;
    }
    ret = found ? Py_BuildValue("(d(nn))", top.score, top.layer, top.e) : (Py_INCREF(Py_None), Py_None);
done:
    for (Py_ssize_t i = 0; i < ns; i++)
        if (h_push(self, skipped[i]) < 0) {
            Py_CLEAR(ret);
            break;
        }
    free(skipped);
    return ret;
}

static Py_ssize_t mh_len(MinHeapObject *self) { return self->nlive; }

static PySequenceMethods mh_seq = {.sq_length = (lenfunc)mh_len};

static PyMethodDef mh_methods[] = {
    {"set", (PyCFunction)mh_set, METH_VARARGS, "LazyMinHeap.set(key, score, tie)."},
    {"discard", (PyCFunction)mh_discard, METH_O, "LazyMinHeap.discard(key)."},
    {"peek", (PyCFunction)mh_peek, METH_O, "LazyMinHeap.peek(protected): (score, key) or None."},
    {NULL, NULL, 0, NULL},
};

PyTypeObject MinHeapType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "harness.engine.native._policyc.MinHeap",
    .tp_basicsize = sizeof(MinHeapObject),
    .tp_dealloc = (destructor)mh_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "LazyMinHeap of harness.engine.cache.policies.heaps for (layer, expert) keys, compiled (the same peeks).",
    .tp_methods = mh_methods,
    .tp_as_sequence = &mh_seq,
    .tp_new = PyType_GenericNew,
};
