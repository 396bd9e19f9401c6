/* aged-markov's batch, in AgedCore (policyc_core.c): take closes the open batch for MarkovModel, rescore
   re-scores a layer's resident keys with the new bonus, size is MarkovModel's array size of a layer. */

#include "policyc_aged.h"

/* take() -> (layer, batch, batch_occ) of the open batch, or None; the batch is closed either way */
PyObject *ac_take(AgedCoreObject *self, PyObject *noargs) {
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
PyObject *ac_rescore(AgedCoreObject *self, PyObject *args) {
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

PyObject *ac_size(AgedCoreObject *self, PyObject *arg) {
    Py_ssize_t layer = PyLong_AsSsize_t(arg);
    if (layer == -1 && PyErr_Occurred())
        return NULL;
    if (layer < 0 || layer >= self->n) {
        PyErr_SetString(PyExc_IndexError, "size: layer out of range");
        return NULL;
    }
    return PyLong_FromSsize_t(self->msize[layer]);
}

