/* AgedCore's state, shared by policyc_core.c (the type and its per-lookup calls) and policyc_aged_batch.c
   (aged-markov's batch: take, rescore, size). */

#ifndef BMOE_POLICYC_AGED_H
#define BMOE_POLICYC_AGED_H

#include "policyc.h"

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

/* the layer's stats, grown to hold expert e (NULL and MemoryError if it cannot grow) */
static inline Stats *ac_stats(AgedCoreObject *self, Py_ssize_t layer, Py_ssize_t e) {
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

static inline double ac_score(AgedCoreObject *self, Stats *S, Py_ssize_t e) {
    double s = self->beta * (double)S->last[e] + self->w * S->log2c[e];
    return self->markov ? s + S->bonus[e] : s; /* aged-markov adds its bonus (0.0 when none) */
}

/* policyc_aged_batch.c */
PyObject *ac_take(AgedCoreObject *self, PyObject *noargs);
PyObject *ac_rescore(AgedCoreObject *self, PyObject *args);
PyObject *ac_size(AgedCoreObject *self, PyObject *arg);

#endif
