/* The cache policies' bookkeeping, compiled: harness.engine._policyc, an optional extension (setup.py).
   harness/engine/policies/*.py hold the reference (pure Python and numpy), which runs when this is not
   built or with BMOE_PURE_PYTHON_POLICIES=1; harness/engine/policies/native.py picks. Every decision is
   the reference's, bit for bit (tests/test_cache_decisions.py, tests/test_policy_impls.py):
   - the Markov policies' per-batch arithmetic (learn, ratio, since, duel_step, duel_scores): each numpy
     expression element for element in the same precision (float32 where the reference is float32,
     float64 where it is float64), summed in numpy's order (a reduction over axis 0 of a C-contiguous
     array adds the rows one after the other). The log2 calls stay in numpy (its SIMD log2 differs from
     libm's in the last bit), so the caller runs them between these functions;
   - LayerHeaps and MinHeap, the score heaps (heaps.py): the same victims and peeks;
   - AgedCore, the per-lookup state of aged, aged-decay, aged-markov (and markov-duel's, duel mode): the
     cache calls it directly; Python floats' arithmetic is libm's pow and log2, in the same order.
   Built with -ffp-contract=off: no fused multiply-add, every product rounded on its own. Arrays come
   through the buffer protocol (no numpy headers), C-contiguous, of the dtypes the reference keeps:
   counts float32, last-use tokens float64, indices intp. */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <string.h>

typedef struct {
    Py_buffer v;
    int held;
} Buf;

static void buf_release(Buf *b) {
    if (b->held) {
        PyBuffer_Release(&b->v);
        b->held = 0;
    }
}

/* kind: 'f' float32, 'd' float64, 'i' intp (8 bytes) */
static int buf_get(PyObject *o, Buf *b, char kind, int writable, const char *what) {
    int flags = PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | (writable ? PyBUF_WRITABLE : 0);
    b->held = 0;
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

static Py_ssize_t buf_len(Buf *b) { return b->v.len / b->v.itemsize; }

static int check_idx(const Py_ssize_t *idx, Py_ssize_t n, Py_ssize_t size, const char *what) {
    for (Py_ssize_t i = 0; i < n; i++)
        if (idx[i] < 0 || idx[i] >= size) {
            PyErr_Format(PyExc_IndexError, "%s: index %zd out of 0..%zd", what, idx[i], size - 1);
            return -1;
        }
    return 0;
}

/* learn(tr, src, occ, last, idx, counts, tok, pidx): MarkovModel.close's updates.
   occ[idx] += 1 (counts None) or += counts (an intp array); last[idx] = tok;
   with pidx: tr[pidx[:, None], idx] += 1 and src[pidx] += 1. Indices unique (one add each). */
static PyObject *learn(PyObject *self, PyObject *args) {
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
static PyObject *ratio(PyObject *self, PyObject *args) {
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
static PyObject *since(PyObject *self, PyObject *args) {
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
static PyObject *duel_step(PyObject *self, PyObject *args) {
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

/* duel_scores(lq, la, lr, since, bidx, w, ages, cands_out, row, es) -> list of float.
   markov-duel's candidates: base = w0 + w2 la + w3 lq (+ w1 at bidx, the decode batch's experts)
   (+ w4 lr), cands[i] = base - ages[i] since (float64, lq and lr float32 as the reference's log2 gives
   them); returns cands[row][e] for each e of es. */
static PyObject *duel_scores(PyObject *self, PyObject *args) {
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
    if (bidx.held) {
        const Py_ssize_t *bx = bidx.v.buf;
        if (check_idx(bx, buf_len(&bidx), n, "bidx"))
            goto done;
        for (Py_ssize_t i = 0; i < buf_len(&bidx); i++)
            base[bx[i]] += w1;
    }
    if (lr.held) {
        const float *flr = lr.v.buf;
        for (Py_ssize_t b = 0; b < n; b++)
            base[b] += w4 * (double)flr[b];
    }
    double *fc = c.v.buf;
    for (Py_ssize_t i = 0; i < na; i++)
        for (Py_ssize_t b = 0; b < n; b++)
            fc[i * n + b] = base[b] - fag[i] * fs[b];
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

/* ---- LayerHeaps: harness/engine/policies/heaps.py's LayerHeaps, compiled -------------------------
   Per layer, each resident expert's (score, tie); the tie is a global push counter (older first). A
   layer's head is its live entry with the lowest (score, tie) (ties are unique, so it is one entry,
   whatever the data structure: the Python heap finds the same one). `victim` takes each layer's head
   (the current layer's skips the protected batch), and the first layer maximising
   base[layer] + phase * d / n - score, d the layer steps from cur until the layer runs again (n for cur
   itself), computed in the reference's order: (base + (phase * d) / n) - score. */

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

static int lh_key(LayerHeapsObject *self, PyObject *key, Py_ssize_t *layer, Py_ssize_t *e) {
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

static int lh_set(LayerHeapsObject *self, Py_ssize_t layer, Py_ssize_t e, double score) {
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

static PyObject *lh_discard(LayerHeapsObject *self, PyObject *key) {
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
static PyObject *lh_victim_c(LayerHeapsObject *self, Py_ssize_t cur, PyObject *protected, const double *base,
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

static PyTypeObject LayerHeapsType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "harness.engine._policyc.LayerHeaps",
    .tp_basicsize = sizeof(LayerHeapsObject),
    .tp_dealloc = (destructor)lh_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "LayerHeaps of harness.engine.policies.heaps, compiled (the same victims).",
    .tp_methods = lh_methods,
    .tp_init = (initproc)lh_init,
    .tp_new = PyType_GenericNew,
};

/* ---- AgedCore: the per-lookup state of `aged`, `aged-decay` and `aged-markov` (policies/aged.py), and
   in duel mode markov-duel's (policies/duel.py: only the batch collection, resident sets and victims;
   its scores come from its close, in Python with the functions above) ----
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
    if (self->markov && ac_call_closer(self) < 0)
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

static PyTypeObject AgedCoreType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "harness.engine._policyc.AgedCore",
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

/* ---- MinHeap: heaps.py's LazyMinHeap, compiled (lfu, layer-lfu) ---------------------------------
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

static PyTypeObject MinHeapType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "harness.engine._policyc.MinHeap",
    .tp_basicsize = sizeof(MinHeapObject),
    .tp_dealloc = (destructor)mh_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "LazyMinHeap of harness.engine.policies.heaps for (layer, expert) keys, compiled (the same peeks).",
    .tp_methods = mh_methods,
    .tp_as_sequence = &mh_seq,
    .tp_new = PyType_GenericNew,
};

static PyMethodDef methods[] = {
    {"learn", learn, METH_VARARGS, "MarkovModel.close's count updates."},
    {"ratio", ratio, METH_VARARGS, "use rate q and P / q (before the log2) of MarkovModel.log_ratio."},
    {"since", since, METH_VARARGS, "markov-duel's staleness and its log2 argument."},
    {"duel_step", duel_step, METH_VARARGS, "markov-duel's candidate hits (False: a tie, run numpy)."},
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
