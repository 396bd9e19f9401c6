/* ExpertCache.lookup_batch's loop over one layer batch, compiled (see policyc.c): the same calls to the
   policy, in the same order, with the same arguments, as the reference loop in harness/engine/cache/expert_cache.py. */

#include "policyc.h"

static int call2(PyObject *fn, PyObject *key, PyObject *now) {
    PyObject *args[2] = {key, now};
    PyObject *r = PyObject_Vectorcall(fn, args, 2, NULL);
    if (!r)
        return -1;
    Py_DECREF(r);
    return 0;
}

/* lookup(resident, layer, experts, on_promote, on_hit, on_insert, clock, enabled)
   -> (hits, misses, batch_keys, clock). resident (a set of (layer, expert)) gains the misses; each
   expert is int()-ed; a duplicate only promotes (when enabled) at the current clock; every new one
   ticks the clock, then is a hit (on_hit) or a miss (inserted; on_insert when enabled). */
PyObject *lookup(PyObject *self, PyObject *args) {
    PyObject *resident, *olayer, *experts, *on_promote, *on_hit, *on_insert;
    long long clock;
    int enabled;
    if (!PyArg_ParseTuple(args, "O!OOOOOLp", &PySet_Type, &resident, &olayer, &experts, &on_promote, &on_hit,
                          &on_insert, &clock, &enabled))
        return NULL;
    PyObject *seq = PySequence_Fast(experts, "lookup: experts is not a sequence");
    if (!seq)
        return NULL;
    PyObject *hits = PyList_New(0), *misses = PyList_New(0), *keys = PySet_New(NULL), *ret = NULL;
    PyObject *key = NULL, *e = NULL, *now = NULL;
    if (!hits || !misses || !keys)
        goto done;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    PyObject **items = PySequence_Fast_ITEMS(seq);
    for (Py_ssize_t i = 0; i < n; i++) {
        e = PyNumber_Long(items[i]);
        if (!e)
            goto done;
        key = PyTuple_Pack(2, olayer, e);
        if (!key)
            goto done;
        int dup = PySet_Contains(keys, key);
        if (dup < 0)
            goto done;
        if (dup) {
            if (enabled) {
                now = PyLong_FromLongLong(clock);
                if (!now || call2(on_promote, key, now) < 0)
                    goto done;
                Py_CLEAR(now);
            }
        } else {
            if (PySet_Add(keys, key) < 0)
                goto done;
            clock++;
            int hit = PySet_Contains(resident, key);
            if (hit < 0)
                goto done;
            if (PyList_Append(hit ? hits : misses, e) < 0)
                goto done;
            if (!hit && PySet_Add(resident, key) < 0)
                goto done;
            if (hit || enabled) {
                now = PyLong_FromLongLong(clock);
                if (!now || call2(hit ? on_hit : on_insert, key, now) < 0)
                    goto done;
                Py_CLEAR(now);
            }
        }
        Py_CLEAR(key);
        Py_CLEAR(e);
    }
    ret = Py_BuildValue("(OOOL)", hits, misses, keys, clock);
done:
    Py_XDECREF(key); Py_XDECREF(e); Py_XDECREF(now);
    Py_XDECREF(hits); Py_XDECREF(misses); Py_XDECREF(keys);
    Py_DECREF(seq);
    return ret;
}

/* evict(resident, protected, victim, on_evict, expert_bytes, resident_bytes, budget) -> (evicted, resident_bytes).
   ExpertCache.evict_over_budget's loop: while resident_bytes > budget, key = victim(protected) (None: stop),
   removed from resident, its layer's bytes taken off, then on_evict(key). */
PyObject *evict(PyObject *self, PyObject *args) {
    PyObject *resident, *protected, *victim, *on_evict, *ebytes;
    long long rb, budget;
    if (!PyArg_ParseTuple(args, "O!OOOO!LL", &PySet_Type, &resident, &protected, &victim, &on_evict, &PyList_Type,
                          &ebytes, &rb, &budget))
        return NULL;
    PyObject *out = PyList_New(0), *key = NULL, *ret = NULL;
    if (!out)
        return NULL;
    while (rb > budget) {
        PyObject *a[1] = {protected};
        key = PyObject_Vectorcall(victim, a, 1, NULL);
        if (!key)
            goto done;
        if (key == Py_None)
            break;
        if (!PyTuple_Check(key) || PyTuple_GET_SIZE(key) != 2) {
            PyErr_SetString(PyExc_TypeError, "evict: a victim is not a (layer, expert) tuple");
            goto done;
        }
        int had = PySet_Discard(resident, key);
        if (had < 0)
            goto done;
        if (!had) {
            PyErr_SetObject(PyExc_KeyError, key);
            goto done;
        }
        Py_ssize_t layer = PyLong_AsSsize_t(PyTuple_GET_ITEM(key, 0));
        if (layer == -1 && PyErr_Occurred())
            goto done;
        PyObject *ob = PyList_GetItem(ebytes, layer < 0 ? layer + PyList_GET_SIZE(ebytes) : layer);
        if (!ob)
            goto done;
        long long b = PyLong_AsLongLong(ob);
        if (b == -1 && PyErr_Occurred())
            goto done;
        rb -= b;
        PyObject *r = PyObject_Vectorcall(on_evict, &key, 1, NULL);
        if (!r)
            goto done;
        Py_DECREF(r);
        if (PyList_Append(out, key) < 0)
            goto done;
        Py_CLEAR(key);
    }
    ret = Py_BuildValue("(OL)", out, rb);
done:
    Py_XDECREF(key);
    Py_DECREF(out);
    return ret;
}
