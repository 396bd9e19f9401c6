#include "policyc.h"

/* LayerHeaps: harness/engine/cache/policies/heaps.py's LayerHeaps, compiled (see policyc.c).
   Per layer, each resident expert's (score, tie); the tie is a global push counter (older first). A
   layer's head is its live entry with the lowest (score, tie) (ties are unique, so it is one entry,
   whatever the data structure: the Python heap finds the same one). `victim` takes each layer's head
   (the current layer's skips the protected batch), and the first layer maximising
   base[layer] + phase * d / n - score, d the layer steps from cur until the layer runs again (n for cur
   itself), computed in the reference's order: (base + (phase * d) / n) - score. */

static void lh_dealloc(LayerHeapsObject *self) {
    for (Py_ssize_t i = 0; i < self->n; i++) {
        free(self->layers[i].score); free(self->layers[i].tie); free(self->layers[i].live);
    }
    free(self->layers);
    free(self->mask);
    Py_XDECREF(self->prot);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int lh_init(LayerHeapsObject *self, PyObject *args, PyObject *kw) {
    Py_ssize_t n;
    if (!PyArg_ParseTuple(args, "n", &n))
        return -1;
    if (n < 0) {
        PyErr_SetString(PyExc_ValueError, "LayerHeaps: n_layer < 0");
        return -1;
    }
    self->layers = calloc((size_t)(n ? n : 1), sizeof(Layer));
    if (!self->layers) {
        PyErr_NoMemory();
        return -1;
    }
    self->n = n;
    for (Py_ssize_t i = 0; i < n; i++)
        self->layers[i].head = -1;
    self->prot_layer = -1;
    return 0;
}

int lh_key(LayerHeapsObject *self, PyObject *key, Py_ssize_t *layer, Py_ssize_t *e) {
    if (!PyTuple_Check(key) || PyTuple_GET_SIZE(key) != 2) {
        PyErr_SetString(PyExc_TypeError, "LayerHeaps: a key is a (layer, expert) tuple");
        return -1;
    }
    *layer = PyLong_AsSsize_t(PyTuple_GET_ITEM(key, 0));
    if (*layer == -1 && PyErr_Occurred())
        return -1;
    *e = PyLong_AsSsize_t(PyTuple_GET_ITEM(key, 1));
    if (*e == -1 && PyErr_Occurred())
        return -1;
    if (*layer < 0 || *layer >= self->n || *e < 0) {
        PyErr_Format(PyExc_IndexError, "LayerHeaps: key (%zd, %zd) out of range", *layer, *e);
        return -1;
    }
    return 0;
}

int lh_set(LayerHeapsObject *self, Py_ssize_t layer, Py_ssize_t e, double score) {
    Layer *L = &self->layers[layer];
    if (e >= L->cap) {
        Py_ssize_t cap = L->cap ? L->cap : 8;
        while (cap <= e)
            cap *= 2;
        double *s = realloc(L->score, sizeof(double) * (size_t)cap);
        if (s) L->score = s;
        long long *t = realloc(L->tie, sizeof(long long) * (size_t)cap);
        if (t) L->tie = t;
        unsigned char *l = realloc(L->live, (size_t)cap);
        if (l) L->live = l;
        if (!s || !t || !l) {
            PyErr_NoMemory();
            return -1;
        }
        memset(L->live + L->cap, 0, (size_t)(cap - L->cap));
        L->cap = cap;
    }
    if (!L->live[e]) {
        L->live[e] = 1;
        L->nlive++;
    }
    L->score[e] = score;
    L->tie[e] = ++self->tie;
    L->head = -2;
    return 0;
}

static PyObject *lh_push(LayerHeapsObject *self, PyObject *args) {
    PyObject *key;
    double score;
    Py_ssize_t layer, e;
    if (!PyArg_ParseTuple(args, "Od", &key, &score) || lh_key(self, key, &layer, &e) || lh_set(self, layer, e, score))
        return NULL;
    Py_RETURN_NONE;
}

static PyObject *lh_push_many(LayerHeapsObject *self, PyObject *args) {
    Py_ssize_t layer;
    PyObject *okeys, *oscores;
    if (!PyArg_ParseTuple(args, "nOO", &layer, &okeys, &oscores))
        return NULL;
    PyObject *keys = PySequence_Fast(okeys, "push_many: keys must be a sequence");
    if (!keys)
        return NULL;
    PyObject *scores = PySequence_Fast(oscores, "push_many: scores must be a sequence");
    if (!scores) {
        Py_DECREF(keys);
        return NULL;
    }
    PyObject *ret = NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(keys);
    if (PySequence_Fast_GET_SIZE(scores) != n) {
        PyErr_SetString(PyExc_ValueError, "push_many: keys and scores differ in length");
        goto done;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_ssize_t l, e;
        double s = PyFloat_AsDouble(PySequence_Fast_GET_ITEM(scores, i));
        if (s == -1.0 && PyErr_Occurred())
            goto done;
        if (lh_key(self, PySequence_Fast_GET_ITEM(keys, i), &l, &e))
            goto done;
        if (l != layer) {
            PyErr_SetString(PyExc_ValueError, "push_many: a key of another layer");
            goto done;
        }
        if (lh_set(self, l, e, s))
            goto done;
    }
    ret = Py_None;
    Py_INCREF(ret);
done:
    Py_DECREF(keys);
    Py_DECREF(scores);
    return ret;
}

PyObject *lh_discard(LayerHeapsObject *self, PyObject *key) {
    Py_ssize_t layer, e;
    if (lh_key(self, key, &layer, &e))
        return NULL;
    Layer *L = &self->layers[layer];
    if (e < L->cap && L->live[e]) {
        L->live[e] = 0;
        L->nlive--;
        L->head = -2;
    }
    Py_RETURN_NONE;
}

/* the lowest live (score, tie) of L, skipping the experts set in mask (NULL: none); -1 when none */
static Py_ssize_t lh_lowest(const Layer *L, const unsigned char *mask, Py_ssize_t mask_len) {
    Py_ssize_t best = -1;
    if (!L->nlive)
        return -1;
    for (Py_ssize_t e = 0; e < L->cap; e++) {
        if (!L->live[e] || (mask && e < mask_len && mask[e]))
            continue;
        if (best < 0 || L->score[e] < L->score[best] ||
            (L->score[e] == L->score[best] && L->tie[e] < L->tie[best]))
            best = e;
    }
    return best;
}

static int lh_mask(LayerHeapsObject *self, Py_ssize_t cur, PyObject *protected) {
    if (self->prot == protected && self->prot_layer == cur)
        return 0;
    Py_ssize_t need = 0;
    PyObject *it = PyObject_GetIter(protected), *item;
    if (!it)
        return -1;
    /* two passes over a small set: its size, then the marks */
    Py_ssize_t cap = 64, len = 0;
    Py_ssize_t *es = malloc(sizeof(Py_ssize_t) * (size_t)cap);
    if (!es) {
        Py_DECREF(it);
        PyErr_NoMemory();
        return -1;
    }
    while ((item = PyIter_Next(it))) {
        Py_ssize_t l, e;
        int bad = lh_key(self, item, &l, &e);
        Py_DECREF(item);
        if (bad) {
            PyErr_Clear(); /* a key the heaps cannot hold is not one of theirs: it protects nothing */
            continue;
        }
        if (l != cur)
            continue;
        if (len == cap) {
            Py_ssize_t *g = realloc(es, sizeof(Py_ssize_t) * (size_t)(cap *= 2));
            if (!g) {
                free(es);
                Py_DECREF(it);
                PyErr_NoMemory();
                return -1;
            }
            es = g;
        }
        es[len++] = e;
        if (e + 1 > need)
            need = e + 1;
    }
    Py_DECREF(it);
    if (PyErr_Occurred()) {
        free(es);
        return -1;
    }
    if (need > self->mask_len) {
        unsigned char *m = realloc(self->mask, (size_t)need);
        if (!m) {
            free(es);
            PyErr_NoMemory();
            return -1;
        }
        self->mask = m;
        self->mask_len = need;
    }
    if (self->mask_len)
        memset(self->mask, 0, (size_t)self->mask_len);
    for (Py_ssize_t i = 0; i < len; i++)
        self->mask[es[i]] = 1;
    free(es);
    Py_INCREF(protected);
    Py_XSETREF(self->prot, protected);
    self->prot_layer = cur;
    return 0;
}

/* the victim for base[] (one number per layer): a new (layer, expert) tuple, or None */
PyObject *lh_victim_c(LayerHeapsObject *self, Py_ssize_t cur, PyObject *protected, const double *base,
                             double phase) {
    Py_ssize_t n = self->n;
    if (cur < 0 || cur >= n) {
        PyErr_SetString(PyExc_IndexError, "victim: cur out of range");
        return NULL;
    }
    if (lh_mask(self, cur, protected))
        return NULL;
    Py_ssize_t best = -1, best_e = -1;
    double best_s = 0.0;
    for (Py_ssize_t layer = 0; layer < n; layer++) {
        Layer *L = &self->layers[layer];
        Py_ssize_t e;
        if (layer == cur) {
            e = lh_lowest(L, self->mask, self->mask_len);
        } else {
            if (L->head == -2)
                L->head = lh_lowest(L, NULL, 0);
            e = L->head;
        }
        if (e < 0)
            continue;
        Py_ssize_t d = ((layer - cur) % n + n) % n;
        double s = (base[layer] + (phase * (double)(d ? d : n)) / (double)n) - L->score[e];
        if (best < 0 || s > best_s) { /* the first layer with the largest number */
            best = layer;
            best_e = e;
            best_s = s;
        }
    }
    if (best < 0)
        Py_RETURN_NONE;
    return Py_BuildValue("(nn)", best, best_e);
}

static PyObject *lh_victim(LayerHeapsObject *self, PyObject *args) {
    Py_ssize_t cur;
    PyObject *protected, *obase;
    double phase;
    if (!PyArg_ParseTuple(args, "nOOd", &cur, &protected, &obase, &phase))
        return NULL;
    Py_ssize_t n = self->n;
    PyObject *base = PySequence_Fast(obase, "victim: base must be a sequence");
    if (!base)
        return NULL;
    if (PySequence_Fast_GET_SIZE(base) != n) {
        Py_DECREF(base);
        PyErr_SetString(PyExc_ValueError, "victim: base is not one number per layer");
        return NULL;
    }
    double *b = malloc(sizeof(double) * (size_t)(n ? n : 1));
    if (!b) {
        Py_DECREF(base);
        return PyErr_NoMemory();
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        b[i] = PyFloat_AsDouble(PySequence_Fast_GET_ITEM(base, i));
        if (b[i] == -1.0 && PyErr_Occurred()) {
            free(b);
            Py_DECREF(base);
            return NULL;
        }
    }
    Py_DECREF(base);
    PyObject *ret = lh_victim_c(self, cur, protected, b, phase);
    free(b);
    return ret;
}

static PyMethodDef lh_methods[] = {
    {"push", (PyCFunction)lh_push, METH_VARARGS, "Set (or replace) a resident entry's score."},
    {"push_many", (PyCFunction)lh_push_many, METH_VARARGS, "push of each key of a layer, in order."},
    {"discard", (PyCFunction)lh_discard, METH_O, "Forget an entry."},
    {"victim", (PyCFunction)lh_victim, METH_VARARGS, "The victim rule of LayerHeaps.victim."},
    {NULL, NULL, 0, NULL},
};

PyTypeObject LayerHeapsType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "harness.engine.native._policyc.LayerHeaps",
    .tp_basicsize = sizeof(LayerHeapsObject),
    .tp_dealloc = (destructor)lh_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "LayerHeaps of harness.engine.cache.policies.heaps, compiled (the same victims).",
    .tp_methods = lh_methods,
    .tp_init = (initproc)lh_init,
    .tp_new = PyType_GenericNew,
};
