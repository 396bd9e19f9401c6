#include "policyc.h"

/* AgedCore: the per-lookup state of `aged`, `aged-decay` and `aged-markov` (policies/aged.py), and in
   duel mode markov-duel's (policies/duel.py: only the batch collection, resident sets and victims; its
   scores come from its close, in Python with policyc_markov.c), compiled (see policyc.c).
   Per (layer, expert): the opportunity of its last use and log2 of its use count (they outlive
   residency), and aged-markov's bonus; per layer: its runs (opportunities) and the victim rule's base.
   Arithmetic as the reference's Python floats: libm pow and log2 (as CPython's ** and math.log2), the
   same operand order. With markov it also collects the open batch for MarkovModel (its experts in
   lookup order, a dict of their occurrences), tracks each layer's model size by the model's growth
   rule, keeps each layer's resident keys in a Python set (its iteration order is the reference's re-score
   order) and calls `closer` before a victim is chosen while a batch is open, and at the next batch. */
typedef struct {
    long long *last;
    double *log2c, *bonus;
    unsigned char *known;
    Py_ssize_t cap;
} Stats;

typedef struct {
    PyObject_HEAD
    Py_ssize_t n;
    double w, log2_decay, beta;
    int markov;
    Stats *st;
    long long *opp;
    double *base;
    Py_ssize_t cur;
    LayerHeapsObject *heaps;
    /* markov only */
    Py_ssize_t open;
    PyObject *batch;     /* list of int */
    PyObject *batch_occ; /* dict int -> int */
    Py_ssize_t *msize;   /* MarkovModel's array size per layer */
    PyObject *res;       /* list of sets of keys (duel: of experts) */
    PyObject *closer;
    /* duel: markov-duel's calls (no counts; its scores are pushed by its close, a preload's by `preload`) */
    int duel;
    double phase;
    PyObject *preload;
} AgedCoreObject;

static void ac_dealloc(AgedCoreObject *self) {
    if (self->st)
        for (Py_ssize_t i = 0; i < self->n; i++) {
            free(self->st[i].last); free(self->st[i].log2c); free(self->st[i].bonus); free(self->st[i].known);
        }
    free(self->st); free(self->opp); free(self->base); free(self->msize);
    Py_XDECREF(self->heaps); Py_XDECREF(self->batch); Py_XDECREF(self->batch_occ);
    Py_XDECREF(self->res); Py_XDECREF(self->closer); Py_XDECREF(self->preload);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int ac_init(AgedCoreObject *self, PyObject *args, PyObject *kw) {
    Py_ssize_t n;
    int markov;
    PyObject *closer = Py_None, *preload = Py_None;
    self->phase = 1.0;
    if (!PyArg_ParseTuple(args, "ndddp|OpdO", &n, &self->w, &self->log2_decay, &self->beta, &markov, &closer,
                          &self->duel, &self->phase, &preload))
        return -1;
    if (self->duel)
        markov = 1;
    if (n < 0) {
        PyErr_SetString(PyExc_ValueError, "AgedCore: n_layer < 0");
        return -1;
    }
    self->n = n;
    self->markov = markov;
    size_t m = (size_t)(n ? n : 1);
    self->st = calloc(m, sizeof(Stats));
    self->opp = calloc(m, sizeof(long long));
    self->base = calloc(m, sizeof(double));
    self->msize = calloc(m, sizeof(Py_ssize_t));
    if (!self->st || !self->opp || !self->base || !self->msize) {
        PyErr_NoMemory();
        return -1;
    }
    self->heaps = (LayerHeapsObject *)PyObject_CallFunction((PyObject *)&LayerHeapsType, "n", n);
    if (!self->heaps)
        return -1;
    self->open = -1;
    self->batch = PyList_New(0);
    self->batch_occ = PyDict_New();
    self->res = PyList_New(n);
    if (!self->batch || !self->batch_occ || !self->res)
        return -1;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *set = PySet_New(NULL);
        if (!set)
            return -1;
        PyList_SET_ITEM(self->res, i, set);
    }
    Py_INCREF(closer);
    self->closer = closer;
    Py_INCREF(preload);
    self->preload = preload;
    return 0;
}

static Stats *ac_stats(AgedCoreObject *self, Py_ssize_t layer, Py_ssize_t e) {
    Stats *S = &self->st[layer];
    if (e >= S->cap) {
        Py_ssize_t cap = S->cap ? S->cap : 8;
        while (cap <= e)
            cap *= 2;
        long long *l = realloc(S->last, sizeof(long long) * (size_t)cap);
        if (l) S->last = l;
        double *c = realloc(S->log2c, sizeof(double) * (size_t)cap);
        if (c) S->log2c = c;
        double *b = realloc(S->bonus, sizeof(double) * (size_t)cap);
        if (b) S->bonus = b;
        unsigned char *k = realloc(S->known, (size_t)cap);
        if (k) S->known = k;
        if (!l || !c || !b || !k) {
            PyErr_NoMemory();
            return NULL;
        }
        for (Py_ssize_t i = S->cap; i < cap; i++) {
            S->known[i] = 0;
            S->bonus[i] = 0.0;
        }
        S->cap = cap;
    }
    return S;
}

static double ac_score(AgedCoreObject *self, Stats *S, Py_ssize_t e) {
    double s = self->beta * (double)S->last[e] + self->w * S->log2c[e];
    return self->markov ? s + S->bonus[e] : s; /* aged-markov adds its bonus (0.0 when none) */
}

static int ac_call_closer(AgedCoreObject *self) {
    if (self->closer == Py_None)
        return 0;
    PyObject *r = PyObject_CallNoArgs(self->closer);
    if (!r)
        return -1;
    Py_DECREF(r);
    return 0;
}

/* MarkovModel.see: grow the layer's size; in the open batch, collect the expert */
static int ac_see(AgedCoreObject *self, Py_ssize_t layer, Py_ssize_t e, PyObject *oe) {
    Py_ssize_t size = self->msize[layer];
    if (e >= size) {
        Py_ssize_t nw = e + 1;
        if (2 * size > nw) nw = 2 * size;
        if (8 > nw) nw = 8;
        self->msize[layer] = nw;
    }
    if (layer == self->open) {
        if (PyList_Append(self->batch, oe) < 0)
            return -1;
        PyObject *one = PyLong_FromLong(1);
        if (!one || PyDict_SetItem(self->batch_occ, oe, one) < 0) {
            Py_XDECREF(one);
            return -1;
        }
        Py_DECREF(one);
    }
    return 0;
}

static int ac_parse(AgedCoreObject *self, PyObject *args, PyObject **key, Py_ssize_t *layer, Py_ssize_t *e) {
    PyObject *now;
    if (!PyArg_ParseTuple(args, "OO", key, &now))
        return -1;
    return lh_key(self->heaps, *key, layer, e);
}

static PyObject *ac_hit(AgedCoreObject *self, PyObject *key, Py_ssize_t layer, Py_ssize_t e) {
    if (self->markov && ac_see(self, layer, e, PyTuple_GET_ITEM(key, 1)) < 0)
        return NULL;
    if (self->duel)
        Py_RETURN_NONE;
    Stats *S = ac_stats(self, layer, e);
    if (!S)
        return NULL;
    long long opp = self->opp[layer];
    double c;
    if (!S->known[e])
        c = 1.0;
    else
        c = pow(2.0, S->log2c[e] + (double)(opp - S->last[e]) * self->log2_decay) + 1.0;
    S->known[e] = 1;
    S->last[e] = opp;
    S->log2c[e] = log2(c);
    if (!self->markov || layer != self->open) /* aged-markov's open batch is re-scored at its close */
        if (lh_set(self->heaps, layer, e, ac_score(self, S, e)) < 0)
            return NULL;
    Py_RETURN_NONE;
}

static PyObject *ac_on_hit(AgedCoreObject *self, PyObject *args) {
    PyObject *key;
    Py_ssize_t layer, e;
    if (ac_parse(self, args, &key, &layer, &e))
        return NULL;
    return ac_hit(self, key, layer, e);
}

static PyObject *ac_on_insert(AgedCoreObject *self, PyObject *args) {
    PyObject *key;
    Py_ssize_t layer, e;
    if (ac_parse(self, args, &key, &layer, &e))
        return NULL;
    if (self->duel) {
        if (PySet_Add(PyList_GET_ITEM(self->res, layer), PyTuple_GET_ITEM(key, 1)) < 0 ||
            ac_see(self, layer, e, PyTuple_GET_ITEM(key, 1)) < 0)
            return NULL;
        if (layer != self->open && self->preload != Py_None) /* a preload: the layer's current score */
            return PyObject_CallOneArg(self->preload, key);
        Py_RETURN_NONE;
    }
    if (self->markov && PySet_Add(PyList_GET_ITEM(self->res, layer), key) < 0)
        return NULL;
    return ac_hit(self, key, layer, e);
}

static PyObject *ac_on_promote(AgedCoreObject *self, PyObject *args) {
    PyObject *key;
    Py_ssize_t layer, e;
    if (ac_parse(self, args, &key, &layer, &e))
        return NULL;
    if (self->markov && layer == self->open) { /* MarkovModel.promote: one more prompt token */
        PyObject *oe = PyTuple_GET_ITEM(key, 1);
        PyObject *cur = PyDict_GetItemWithError(self->batch_occ, oe);
        if (!cur && PyErr_Occurred())
            return NULL;
        long v = cur ? PyLong_AsLong(cur) : 1;
        if (v == -1 && PyErr_Occurred())
            return NULL;
        PyObject *nv = PyLong_FromLong(v + 1);
        if (!nv || PyDict_SetItem(self->batch_occ, oe, nv) < 0) {
            Py_XDECREF(nv);
            return NULL;
        }
        Py_DECREF(nv);
    }
    if (self->duel)
        Py_RETURN_NONE;
    Stats *S = ac_stats(self, layer, e);
    if (!S)
        return NULL;
    if (!S->known[e]) {
        PyErr_SetObject(PyExc_KeyError, key);
        return NULL;
    }
    S->log2c[e] = log2(pow(2.0, S->log2c[e]) + 1.0);
    if (!self->markov || layer != self->open)
        if (lh_set(self->heaps, layer, e, ac_score(self, S, e)) < 0)
            return NULL;
    Py_RETURN_NONE;
}

static PyObject *ac_on_evict(AgedCoreObject *self, PyObject *key) {
    Py_ssize_t layer, e;
    if (lh_key(self->heaps, key, &layer, &e))
        return NULL;
    if (self->duel) {
        if (PySet_Discard(PyList_GET_ITEM(self->res, layer), PyTuple_GET_ITEM(key, 1)) < 0)
            return NULL;
    } else if (self->markov) {
        if (PySet_Discard(PyList_GET_ITEM(self->res, layer), key) < 0)
            return NULL;
        if (e < self->st[layer].cap)
            self->st[layer].bonus[e] = 0.0;
    }
    return lh_discard(self->heaps, key);
}

static PyObject *ac_on_batch(AgedCoreObject *self, PyObject *args) {
    Py_ssize_t layer;
    PyObject *now;
    if (!PyArg_ParseTuple(args, "nO", &layer, &now))
        return NULL;
    if (layer < 0 || layer >= self->n) {
        PyErr_SetString(PyExc_IndexError, "on_batch: layer out of range");
        return NULL;
    }
    /* the close of an open batch (none open or an empty one: the closer would only close it, as below) */
    if (self->markov && self->open >= 0 && PyList_GET_SIZE(self->batch) > 0 && ac_call_closer(self) < 0)
        return NULL;
    self->cur = layer;
    if (!self->duel) { /* duel: no per-layer term (its base stays 0.0) */
        self->opp[layer] += 1;
        self->base[layer] = self->beta * (double)self->opp[layer];
    }
    if (self->markov)
        self->open = layer;
    Py_RETURN_NONE;
}

static PyObject *ac_victim(AgedCoreObject *self, PyObject *protected) {
    if (self->markov && self->open >= 0 && ac_call_closer(self) < 0)
        return NULL;
    return lh_victim_c(self->heaps, self->cur, protected, self->base, self->duel ? self->phase : 1.0);
}

/* take() -> (layer, batch, batch_occ) of the open batch, or None; the batch is closed either way */
static PyObject *ac_take(AgedCoreObject *self, PyObject *noargs) {
    Py_ssize_t layer = self->open;
    PyObject *batch = self->batch, *occ = self->batch_occ;
    PyObject *nb = PyList_New(0), *no = PyDict_New();
    if (!nb || !no) {
        Py_XDECREF(nb); Py_XDECREF(no);
        return NULL;
    }
    self->open = -1;
    self->batch = nb;
    self->batch_occ = no;
    PyObject *ret;
    if (layer < 0 || PyList_GET_SIZE(batch) == 0) {
        ret = Py_None;
        Py_INCREF(ret);
    } else {
        ret = Py_BuildValue("(nOO)", layer, batch, occ);
    }
    Py_DECREF(batch);
    Py_DECREF(occ);
    return ret;
}

/* rescore(layer, lr, z): each resident key of the layer, in its set's order: bonus = z * lr[e] (lr a
   float32 array, None: 0.0), then pushed with its score (one tie each, in that order) */
static PyObject *ac_rescore(AgedCoreObject *self, PyObject *args) {
    Py_ssize_t layer;
    PyObject *olr;
    double z;
    if (!PyArg_ParseTuple(args, "nOd", &layer, &olr, &z))
        return NULL;
    if (layer < 0 || layer >= self->n) {
        PyErr_SetString(PyExc_IndexError, "rescore: layer out of range");
        return NULL;
    }
    Buf lr = {0};
    if (olr != Py_None && buf_get(olr, &lr, 'f', 0, "lr"))
        return NULL;
    PyObject *it = PyObject_GetIter(PyList_GET_ITEM(self->res, layer)), *key;
    if (!it) {
        buf_release(&lr);
        return NULL;
    }
    /* the keys first (a push never changes the set, but the reference lists them before it pushes) */
    PyObject *keys = PySequence_List(it);
    Py_DECREF(it);
    if (!keys) {
        buf_release(&lr);
        return NULL;
    }
    PyObject *ret = NULL;
    const float *f = lr.held ? lr.v.buf : NULL;
    Py_ssize_t nlr = lr.held ? buf_len(&lr) : 0;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(keys); i++) {
        key = PyList_GET_ITEM(keys, i);
        Py_ssize_t l, e;
        if (lh_key(self->heaps, key, &l, &e))
            goto done;
        Stats *S = ac_stats(self, l, e);
        if (!S)
            goto done;
        if (f) {
            if (e >= nlr) {
                PyErr_SetString(PyExc_IndexError, "rescore: expert beyond the log-ratios");
                goto done;
            }
            S->bonus[e] = z * (double)f[e];
        } else {
            S->bonus[e] = 0.0;
        }
    }
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(keys); i++) {
        Py_ssize_t l, e;
        lh_key(self->heaps, PyList_GET_ITEM(keys, i), &l, &e);
        if (!self->st[l].known[e]) {
            PyErr_SetObject(PyExc_KeyError, PyList_GET_ITEM(keys, i));
            goto done;
        }
        if (lh_set(self->heaps, l, e, ac_score(self, &self->st[l], e)) < 0)
            goto done;
    }
    ret = Py_None;
    Py_INCREF(ret);
done:
    Py_DECREF(keys);
    buf_release(&lr);
    return ret;
}

static PyObject *ac_size(AgedCoreObject *self, PyObject *arg) {
    Py_ssize_t layer = PyLong_AsSsize_t(arg);
    if (layer == -1 && PyErr_Occurred())
        return NULL;
    if (layer < 0 || layer >= self->n) {
        PyErr_SetString(PyExc_IndexError, "size: layer out of range");
        return NULL;
    }
    return PyLong_FromSsize_t(self->msize[layer]);
}

static PyObject *ac_get_open(AgedCoreObject *self, void *c) { return PyLong_FromSsize_t(self->open); }
static PyObject *ac_get_res(AgedCoreObject *self, void *c) { Py_INCREF(self->res); return self->res; }
static PyObject *ac_get_heaps(AgedCoreObject *self, void *c) { Py_INCREF(self->heaps); return (PyObject *)self->heaps; }

static PyGetSetDef ac_getset[] = {
    {"open", (getter)ac_get_open, NULL, "the layer whose batch is open (-1: none)", NULL},
    {"res", (getter)ac_get_res, NULL, "each layer's resident keys (markov; duel: experts)", NULL},
    {"heaps", (getter)ac_get_heaps, NULL, "the LayerHeaps the victims come from", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyMethodDef ac_methods[] = {
    {"on_batch", (PyCFunction)ac_on_batch, METH_VARARGS, "Policy.on_batch."},
    {"on_hit", (PyCFunction)ac_on_hit, METH_VARARGS, "Policy.on_hit."},
    {"on_insert", (PyCFunction)ac_on_insert, METH_VARARGS, "Policy.on_insert."},
    {"on_promote", (PyCFunction)ac_on_promote, METH_VARARGS, "Policy.on_promote."},
    {"on_evict", (PyCFunction)ac_on_evict, METH_O, "Policy.on_evict."},
    {"victim", (PyCFunction)ac_victim, METH_O, "Policy.victim."},
    {"take", (PyCFunction)ac_take, METH_NOARGS, "Close the open batch: (layer, batch, batch_occ) or None."},
    {"rescore", (PyCFunction)ac_rescore, METH_VARARGS, "aged-markov's re-score of a layer after its batch."},
    {"size", (PyCFunction)ac_size, METH_O, "MarkovModel's array size of a layer, by its growth rule."},
    {NULL, NULL, 0, NULL},
};

PyTypeObject AgedCoreType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "harness.engine.native._policyc.AgedCore",
    .tp_basicsize = sizeof(AgedCoreObject),
    .tp_dealloc = (destructor)ac_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "AgedCore(n_layer, w, log2_decay, beta, markov, closer=None, duel=False, phase=1.0, preload=None): "
               "the aged policies' state (duel: markov-duel's), compiled.",
    .tp_methods = ac_methods,
    .tp_getset = ac_getset,
    .tp_init = (initproc)ac_init,
    .tp_new = PyType_GenericNew,
};
