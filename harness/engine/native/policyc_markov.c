/* The Markov policies' per-batch arithmetic, compiled (see policyc.c): the numpy expressions of
   policies/markov.py and duel.py, element for element. */

#include "policyc.h"

/* learn(tr, src, occ, last, idx, counts, tok, pidx): MarkovModel.close's updates.
   occ[idx] += 1 (counts None) or += counts (an intp array); last[idx] = tok;
   with pidx: tr[pidx[:, None], idx] += 1 and src[pidx] += 1. Indices unique (one add each). */
PyObject *learn(PyObject *self, PyObject *args) {
    PyObject *otr, *osrc, *oocc, *olast, *oidx, *ocnt, *opidx;
    double tok;
    if (!PyArg_ParseTuple(args, "OOOOOOdO", &otr, &osrc, &oocc, &olast, &oidx, &ocnt, &tok, &opidx))
        return NULL;
    Buf tr = {0}, src = {0}, occ = {0}, last = {0}, idx = {0}, cnt = {0}, pidx = {0};
    PyObject *ret = NULL;
    if (buf_get(otr, &tr, 'f', 1, "tr") || buf_get(osrc, &src, 'f', 1, "src") ||
        buf_get(oocc, &occ, 'f', 1, "occ") || buf_get(olast, &last, 'd', 1, "last") ||
        buf_get(oidx, &idx, 'i', 0, "idx"))
        goto done;
    if (ocnt != Py_None && buf_get(ocnt, &cnt, 'i', 0, "counts"))
        goto done;
    if (opidx != Py_None && buf_get(opidx, &pidx, 'i', 0, "pidx"))
        goto done;
    Py_ssize_t size = buf_len(&src), n = buf_len(&idx);
    if (buf_len(&occ) != size || buf_len(&last) != size || buf_len(&tr) != size * size ||
        (cnt.held && buf_len(&cnt) != n)) {
        PyErr_SetString(PyExc_ValueError, "learn: array sizes disagree");
        goto done;
    }
    const Py_ssize_t *ix = idx.v.buf;
    if (check_idx(ix, n, size, "idx"))
        goto done;
    float *fo = occ.v.buf;
    double *fl = last.v.buf;
    for (Py_ssize_t i = 0; i < n; i++) {
        fo[ix[i]] += cnt.held ? (float)((const Py_ssize_t *)cnt.v.buf)[i] : 1.0f;
        fl[ix[i]] = tok;
    }
    if (pidx.held) {
        const Py_ssize_t *px = pidx.v.buf;
        Py_ssize_t np_ = buf_len(&pidx);
        if (check_idx(px, np_, size, "pidx"))
            goto done;
        float *ft = tr.v.buf, *fs = src.v.buf;
        for (Py_ssize_t a = 0; a < np_; a++) {
            float *row = ft + px[a] * size;
            for (Py_ssize_t i = 0; i < n; i++)
                row[ix[i]] += 1.0f;
            fs[px[a]] += 1.0f;
        }
    }
    ret = Py_None;
    Py_INCREF(ret);
done:
    buf_release(&tr); buf_release(&src); buf_release(&occ); buf_release(&last);
    buf_release(&idx); buf_release(&cnt); buf_release(&pidx);
    return ret;
}

/* ratio(tr, src, occ, tokens, k, m, pidx, q_out, r_out): q = use_rate(occ, tokens, k) into q_out
   (float32); with pidx (else r_out is left alone) r_out = P / q, where P is the float32 row mean over
   pidx of (tr[a] + m q) / (src[a] + m), as MarkovModel.log_ratio computes it before its log2. */
PyObject *ratio(PyObject *self, PyObject *args) {
    PyObject *otr, *osrc, *oocc, *opidx, *oq, *or_;
    double tokens, m;
    Py_ssize_t k;
    if (!PyArg_ParseTuple(args, "OOOdndOOO", &otr, &osrc, &oocc, &tokens, &k, &m, &opidx, &oq, &or_))
        return NULL;
    Buf tr = {0}, src = {0}, occ = {0}, pidx = {0}, q = {0}, r = {0};
    PyObject *ret = NULL;
    if (buf_get(otr, &tr, 'f', 0, "tr") || buf_get(osrc, &src, 'f', 0, "src") ||
        buf_get(oocc, &occ, 'f', 0, "occ") || buf_get(oq, &q, 'f', 1, "q_out"))
        goto done;
    if (opidx != Py_None && (buf_get(opidx, &pidx, 'i', 0, "pidx") || buf_get(or_, &r, 'f', 1, "r_out")))
        goto done;
    Py_ssize_t size = buf_len(&src);
    if (buf_len(&occ) != size || buf_len(&q) != size || buf_len(&tr) != size * size ||
        (r.held && buf_len(&r) != size) || k <= 0) {
        PyErr_SetString(PyExc_ValueError, "ratio: array sizes disagree");
        goto done;
    }
    const float *fo = occ.v.buf;
    float *fq = q.v.buf;
    /* (occ + 0.5) / (tokens + 0.5 * size / k): the Python-float denominator becomes float32 first */
    const float den = (float)(tokens + 0.5 * (double)size / (double)k);
    for (Py_ssize_t b = 0; b < size; b++)
        fq[b] = (fo[b] + 0.5f) / den;
    if (pidx.held) {
        const Py_ssize_t *px = pidx.v.buf;
        Py_ssize_t rows = buf_len(&pidx);
        if (rows == 0) {
            PyErr_SetString(PyExc_ValueError, "ratio: empty pidx");
            goto done;
        }
        if (check_idx(px, rows, size, "pidx"))
            goto done;
        const float *ft = tr.v.buf, *fs = src.v.buf;
        const float mf = (float)m;
        float *fr = r.v.buf;
        for (Py_ssize_t b = 0; b < size; b++) {
            const float mq = mf * fq[b];
            float p = 0.0f;
            for (Py_ssize_t a = 0; a < rows; a++) {
                const float x = (ft[px[a] * size + b] + mq) / (fs[px[a]] + mf);
                p = a == 0 ? x : p + x; /* the first row is copied, the next ones added in order */
            }
            p = (float)((double)p / (double)rows); /* true_divide by the intp count: double, then cast */
            fr[b] = p / fq[b];
        }
    }
    ret = PyBool_FromLong(pidx.held);
done:
    buf_release(&tr); buf_release(&src); buf_release(&occ); buf_release(&pidx);
    buf_release(&q); buf_release(&r);
    return ret;
}

/* since(last, tok, since_out, arg_out): since = min(tok - last, 1e4), arg = 1 + min(since, 63)
   (markov-duel's staleness and the argument of its log2), float64. */
PyObject *since(PyObject *self, PyObject *args) {
    PyObject *olast, *os, *oa;
    double tok;
    if (!PyArg_ParseTuple(args, "OdOO", &olast, &tok, &os, &oa))
        return NULL;
    Buf last = {0}, s = {0}, a = {0};
    PyObject *ret = NULL;
    if (buf_get(olast, &last, 'd', 0, "last") || buf_get(os, &s, 'd', 1, "since_out") ||
        buf_get(oa, &a, 'd', 1, "arg_out"))
        goto done;
    Py_ssize_t n = buf_len(&last);
    if (buf_len(&s) != n || buf_len(&a) != n) {
        PyErr_SetString(PyExc_ValueError, "since: array sizes disagree");
        goto done;
    }
    const double *fl = last.v.buf;
    double *fs = s.v.buf, *fa = a.v.buf;
    for (Py_ssize_t b = 0; b < n; b++) {
        double d = tok - fl[b];
        d = d < 1e4 ? d : 1e4; /* np.minimum; no NaN can occur (finite tokens) */
        fs[b] = d;
        fa[b] = 1.0 + (d < 63.0 ? d : 63.0);
    }
    ret = Py_None;
    Py_INCREF(ret);
done:
    buf_release(&last); buf_release(&s); buf_release(&a);
    return ret;
}

/* the k-th largest of a[0..n) (1 <= k <= n; a is reordered), by quickselect (no NaN in a) */
static double kth_largest(double *a, Py_ssize_t n, Py_ssize_t k) {
    Py_ssize_t lo = 0, hi = n - 1, want = k - 1;
    while (lo < hi) {
        double piv = a[lo + (hi - lo) / 2];
        Py_ssize_t i = lo, j = hi;
        while (i <= j) {
            while (a[i] > piv) i++;
            while (a[j] < piv) j--;
            if (i <= j) {
                double t = a[i]; a[i] = a[j]; a[j] = t;
                i++;
                j--;
            }
        }
        if (want <= j)
            hi = j;
        else if (want >= i)
            lo = i;
        else
            return a[want];
    }
    return a[want];
}

/* duel_step(pred, idx, k, decay, duel) -> bool. For each row of pred (n_cand x n0, float64): how many
   of the row's k largest are experts of idx (those < n0), as np.argpartition(-pred, k - 1)[:, :k]
   picks them; then duel = decay * duel + counts. When a row's k-th value is tied between used and
   unused experts, which of them argpartition keeps is its own business: nothing is changed and False
   is returned (the caller runs numpy). */
PyObject *duel_step(PyObject *self, PyObject *args) {
    PyObject *opred, *oidx, *oduel;
    Py_ssize_t k;
    double decay;
    if (!PyArg_ParseTuple(args, "OOndO", &opred, &oidx, &k, &decay, &oduel))
        return NULL;
    Buf pred = {0}, idx = {0}, duel = {0};
    PyObject *ret = NULL;
    unsigned char *used = NULL;
    double *topv = NULL, *counts = NULL;
    if (buf_get(opred, &pred, 'd', 0, "pred") || buf_get(oidx, &idx, 'i', 0, "idx") ||
        buf_get(oduel, &duel, 'd', 1, "duel"))
        goto done;
    Py_ssize_t rows = buf_len(&duel);
    if (pred.v.ndim != 2 || pred.v.shape[0] != rows) {
        PyErr_SetString(PyExc_ValueError, "duel_step: pred is not n_cand x n");
        goto done;
    }
    Py_ssize_t n0 = pred.v.shape[1];
    if (k < 1 || k > n0) {
        PyErr_SetString(PyExc_ValueError, "duel_step: k out of range");
        goto done;
    }
    used = calloc((size_t)n0, 1);
    topv = malloc(sizeof(double) * (size_t)n0);
    counts = malloc(sizeof(double) * (size_t)rows);
    if (!used || !topv || !counts) {
        PyErr_NoMemory();
        goto done;
    }
    const Py_ssize_t *ix = idx.v.buf;
    for (Py_ssize_t i = 0; i < buf_len(&idx); i++)
        if (ix[i] >= 0 && ix[i] < n0)
            used[ix[i]] = 1;
    /* the used experts, once each */
    Py_ssize_t nu = 0, *us = malloc(sizeof(Py_ssize_t) * (size_t)n0);
    if (!us) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t i = 0; i < buf_len(&idx); i++)
        if (ix[i] >= 0 && ix[i] < n0 && used[ix[i]] == 1) {
            used[ix[i]] = 2;
            us[nu++] = ix[i];
        }
    int exact = 1;
    for (Py_ssize_t r = 0; r < rows && exact; r++) {
        const double *row = (const double *)pred.v.buf + r * n0;
        memcpy(topv, row, sizeof(double) * (size_t)n0);
        const double kth = kth_largest(topv, n0, k); /* the row's k-th largest value */
        Py_ssize_t cnt = 0;
        int tied = 0;
        for (Py_ssize_t j = 0; j < nu; j++) {
            cnt += row[us[j]] > kth; /* above the k-th: kept by any top-k */
            tied |= row[us[j]] == kth;
        }
        if (tied) { /* a used expert holds the k-th value: of the eq experts holding it, k - gt are kept */
            Py_ssize_t gt = 0, eq = 0, used_eq = 0;
            for (Py_ssize_t b = 0; b < n0; b++) {
                gt += row[b] > kth;
                if (row[b] == kth) {
                    eq++;
                    used_eq += used[b] != 0;
                }
            }
            if (k - gt == eq)
                cnt += used_eq; /* all of them kept */
            else if (used_eq == eq)
                cnt += k - gt; /* all of them used */
            else
                exact = 0; /* which of the tied ones argpartition keeps is its own business */
        }
        counts[r] = (double)cnt;
    }
    free(us);
    if (exact) {
        double *fd = duel.v.buf;
        for (Py_ssize_t r = 0; r < rows; r++)
            fd[r] = decay * fd[r] + counts[r];
    }
    ret = PyBool_FromLong(exact);
done:
    free(used); free(topv); free(counts);
    buf_release(&pred); buf_release(&idx); buf_release(&duel);
    return ret;
}

/* markov-duel's score rows from the per-expert base (bias, staleness and rate terms in): + w1 where the expert is
   in the batch (bidx, if held), + w4 * the Markov log-ratio (lr, float32, if held), then one row per candidate
   age: c[i * n + b] = base[b] - ages[i] * since[b]. -1 with an exception set on a bad index. Shared by
   duel_scores and duel_close (policyc_duel.c): the same operations in the same order, so the same bits. */
int duel_rows(double *base, Py_ssize_t n, Buf *bidx, double w1, Buf *lr, double w4, double *c, Py_ssize_t na,
              const double *ages, const double *since) {
    if (bidx->held) {
        const Py_ssize_t *bx = bidx->v.buf;
        if (check_idx(bx, buf_len(bidx), n, "bidx"))
            return -1;
        for (Py_ssize_t i = 0; i < buf_len(bidx); i++)
            base[bx[i]] += w1;
    }
    if (lr->held) {
        const float *flr = lr->v.buf;
        for (Py_ssize_t b = 0; b < n; b++)
            base[b] += w4 * (double)flr[b];
    }
    for (Py_ssize_t i = 0; i < na; i++)
        for (Py_ssize_t b = 0; b < n; b++)
            c[i * n + b] = base[b] - ages[i] * since[b];
    return 0;
}

/* duel_scores(lq, la, lr, since, bidx, w, ages, cands_out, row, es) -> list of float.
   markov-duel's candidates: base = w0 + w2 la + w3 lq (+ w1 at bidx, the decode batch's experts)
   (+ w4 lr), cands[i] = base - ages[i] since (float64, lq and lr float32 as the reference's log2 gives
   them); returns cands[row][e] for each e of es. */
PyObject *duel_scores(PyObject *self, PyObject *args) {
    PyObject *olq, *ola, *olr, *os, *obidx, *oages, *oc, *oes;
    double w0, w1, w2, w3, w4;
    Py_ssize_t row;
    if (!PyArg_ParseTuple(args, "OOOOO(ddddd)OOnO", &olq, &ola, &olr, &os, &obidx, &w0, &w1, &w2, &w3, &w4,
                          &oages, &oc, &row, &oes))
        return NULL;
    Buf lq = {0}, la = {0}, lr = {0}, s = {0}, bidx = {0}, ages = {0}, c = {0};
    PyObject *ret = NULL, *es = NULL;
    double *base = NULL;
    if (buf_get(olq, &lq, 'f', 0, "lq") || buf_get(ola, &la, 'd', 0, "la") || buf_get(os, &s, 'd', 0, "since") ||
        buf_get(oages, &ages, 'd', 0, "ages") || buf_get(oc, &c, 'd', 1, "cands_out"))
        goto done;
    if (olr != Py_None && buf_get(olr, &lr, 'f', 0, "lr"))
        goto done;
    if (obidx != Py_None && buf_get(obidx, &bidx, 'i', 0, "bidx"))
        goto done;
    Py_ssize_t n = buf_len(&lq), na = buf_len(&ages);
    if (buf_len(&la) != n || buf_len(&s) != n || (lr.held && buf_len(&lr) != n) || buf_len(&c) != na * n ||
        row < 0 || row >= na) {
        PyErr_SetString(PyExc_ValueError, "duel_scores: array sizes disagree");
        goto done;
    }
    base = malloc(sizeof(double) * (size_t)(n ? n : 1));
    if (!base) {
        PyErr_NoMemory();
        goto done;
    }
    const float *flq = lq.v.buf;
    const double *fla = la.v.buf, *fs = s.v.buf, *fag = ages.v.buf;
    for (Py_ssize_t b = 0; b < n; b++)
        base[b] = (w0 + w2 * fla[b]) + w3 * (double)flq[b];
    double *fc = c.v.buf;
    if (duel_rows(base, n, &bidx, w1, &lr, w4, fc, na, fag, fs))
        goto done;
    es = PySequence_Fast(oes, "duel_scores: es must be a sequence");
    if (!es)
        goto done;
    Py_ssize_t ne = PySequence_Fast_GET_SIZE(es);
    PyObject *out = PyList_New(ne);
    if (!out)
        goto done;
    const double *sr = fc + row * n;
    for (Py_ssize_t i = 0; i < ne; i++) {
        Py_ssize_t e = PyLong_AsSsize_t(PySequence_Fast_GET_ITEM(es, i));
        if (e == -1 && PyErr_Occurred()) {
            Py_DECREF(out);
            goto done;
        }
        if (e < 0 || e >= n) {
            PyErr_Format(PyExc_IndexError, "duel_scores: expert %zd out of 0..%zd", e, n - 1);
            Py_DECREF(out);
            goto done;
        }
        PyObject *f = PyFloat_FromDouble(sr[e]);
        if (!f) {
            Py_DECREF(out);
            goto done;
        }
        PyList_SET_ITEM(out, i, f);
    }
    ret = out;
done:
    free(base);
    Py_XDECREF(es);
    buf_release(&lq); buf_release(&la); buf_release(&lr); buf_release(&s); buf_release(&bidx);
    buf_release(&ages); buf_release(&c);
    return ret;
}
