/* markov-duel's close after its log2s, in one call (see policyc.c): `since` and `duel_scores` of
   policyc_markov.c fused, the log2 of the staleness read from a table numpy computed, the chosen
   candidate picked and the layer's resident entries pushed into its heaps. */

#include "policyc.h"

/* duel_close(pred, didx, kslots, decay, lq, lr, last, tok, tab, bidx, w, ages, cands_out, duel, heaps, layer, res)
   -> row, -1 or -2. First, with pred (the last close's candidates, None: no step), the duel step:
   duel_step(pred, didx, min(kslots, pred's columns - 1), decay, duel); a tie it leaves to numpy: -2, nothing
   changed. Then since = min(tok - last, 1e4), arg = 1 + min(since, 63); log2(arg) = tab[arg - 1] (tab:
   numpy's log2 of 1..len(tab)); base = w0 + w2 log2(arg) + w3 lq (+ w1 at bidx) (+ w4 lr); cands[i] =
   base - ages[i] since; row = the first of duel's largest (np.argmax); then each expert e of the set res,
   in its iteration order, is pushed into heaps' `layer` with cands[row][e] (LayerHeaps.push_many). -1 when
   an arg is not a whole number the table holds: the duel step done, nothing else; the caller takes numpy's
   path for the scores. */
PyObject *duel_close(PyObject *self, PyObject *args) {
    PyObject *opred, *odidx, *olq, *olr, *olast, *otab, *obidx, *oages, *oc, *oduel, *oheaps, *ores;
    double decay, tok, w0, w1, w2, w3, w4;
    Py_ssize_t kslots, layer;
    if (!PyArg_ParseTuple(args, "OOndOOOdOO(ddddd)OOOO!nO!", &opred, &odidx, &kslots, &decay, &olq, &olr, &olast,
                          &tok, &otab, &obidx, &w0, &w1, &w2, &w3, &w4, &oages, &oc, &oduel, &LayerHeapsType, &oheaps,
                          &layer, &PySet_Type, &ores))
        return NULL;
    if (opred != Py_None) {
        Py_buffer pv;
        if (PyObject_GetBuffer(opred, &pv, PyBUF_ND) < 0)
            return NULL;
        Py_ssize_t n0 = pv.ndim == 2 ? pv.shape[1] : 0;
        PyBuffer_Release(&pv);
        Py_ssize_t k = kslots < n0 - 1 ? kslots : n0 - 1;
        PyObject *a = Py_BuildValue("(OOndO)", opred, odidx, k, decay, oduel);
        if (!a)
            return NULL;
        PyObject *exact = duel_step(self, a);
        Py_DECREF(a);
        if (!exact)
            return NULL;
        int tie = exact == Py_False;
        Py_DECREF(exact);
        if (tie)
            return PyLong_FromLong(-2);
    }
    Buf lq = {0}, lr = {0}, last = {0}, tab = {0}, bidx = {0}, ages = {0}, c = {0}, duel = {0};
    PyObject *ret = NULL, *it = NULL, *oe = NULL;
    double *sb = NULL;
    if (buf_get(olq, &lq, 'f', 0, "lq") || buf_get(olast, &last, 'd', 0, "last") ||
        buf_get(otab, &tab, 'd', 0, "tab") || buf_get(oages, &ages, 'd', 0, "ages") ||
        buf_get(oc, &c, 'd', 1, "cands_out") || buf_get(oduel, &duel, 'd', 0, "duel"))
        goto done;
    if (olr != Py_None && buf_get(olr, &lr, 'f', 0, "lr"))
        goto done;
    if (obidx != Py_None && buf_get(obidx, &bidx, 'i', 0, "bidx"))
        goto done;
    LayerHeapsObject *heaps = (LayerHeapsObject *)oheaps;
    Py_ssize_t n = buf_len(&lq), na = buf_len(&ages), nt = buf_len(&tab);
    if (buf_len(&last) != n || (lr.held && buf_len(&lr) != n) || buf_len(&c) != na * n || buf_len(&duel) != na ||
        na < 1 || layer < 0 || layer >= heaps->n) {
        PyErr_SetString(PyExc_ValueError, "duel_close: array sizes disagree");
        goto done;
    }
    sb = malloc(sizeof(double) * (size_t)(2 * n + 1));
    if (!sb) {
        PyErr_NoMemory();
        goto done;
    }
    double *since = sb, *base = sb + n;
    const double *fl = last.v.buf, *ft = tab.v.buf, *fag = ages.v.buf, *fd = duel.v.buf;
    const float *flq = lq.v.buf;
    for (Py_ssize_t b = 0; b < n; b++) {
        double d = tok - fl[b];
        d = d < 1e4 ? d : 1e4; /* np.minimum; no NaN can occur (finite tokens) */
        const double arg = 1.0 + (d < 63.0 ? d : 63.0);
        if (!(arg >= 1.0 && arg <= (double)nt && arg == (double)(Py_ssize_t)arg)) {
            ret = PyLong_FromLong(-1);
            goto done;
        }
        since[b] = d;
        base[b] = (w0 + w2 * ft[(Py_ssize_t)arg - 1]) + w3 * (double)flq[b];
    }
    double *fc = c.v.buf;
    if (duel_rows(base, n, &bidx, w1, &lr, w4, fc, na, fag, since))
        goto done;
    Py_ssize_t row = 0;
    for (Py_ssize_t i = 1; i < na; i++)
        if (fd[i] > fd[row])
            row = i;
    const double *sr = fc + row * n;
    it = PyObject_GetIter(ores);
    if (!it)
        goto done;
    while ((oe = PyIter_Next(it))) {
        Py_ssize_t e = PyLong_AsSsize_t(oe);
        Py_CLEAR(oe);
        if (e == -1 && PyErr_Occurred())
            goto done;
        if (e < 0 || e >= n) {
            PyErr_Format(PyExc_IndexError, "duel_close: expert %zd out of 0..%zd", e, n - 1);
            goto done;
        }
        if (lh_set(heaps, layer, e, sr[e]))
            goto done;
    }
    if (PyErr_Occurred())
        goto done;
    ret = PyLong_FromSsize_t(row);
done:
    free(sb);
    Py_XDECREF(it);
    buf_release(&lq); buf_release(&lr); buf_release(&last); buf_release(&tab); buf_release(&bidx);
    buf_release(&ages); buf_release(&c); buf_release(&duel);
    return ret;
}
