/* Groups of reads on the read lanes (clanes.c): built and queued (submit, submit_groups, the registered tensors'
 * submit_layer), promoted, withdrawn or cancelled while queued, waited for and read back (collect, detail),
 * released. Every queue change holds the lanes' mutex, as in clanes.c. */
#include "clanes_common.h"

/* wake as many idle lanes as can take work now (a woken lane that cannot take a job only costs a switch) */
static void wake(lanes_t *L, int n, int spec) {
    int can = spec ? L->spec_max - L->spec_running : n;
    if (can > n) can = n;
    if (can > L->idle) can = L->idle;
    if (can <= 0) return;
    if (can == 1) pthread_cond_signal(&L->work);
    else pthread_cond_broadcast(&L->work);
}

static grp *new_group(int n, int spec) {
    grp *g = calloc(1, sizeof *g + (size_t)n * sizeof(rd));
    if (!g) return NULL;
    g->n = g->remaining = n;
    g->spec = spec;
    for (int i = 0; i < n; i++) {
        g->r[i].g = g;
        g->r[i].lane = -1;
        g->r[i].state = spec ? Q_SPEC : Q_DEMAND;
    }
    return g;
}

/* queue the built groups out[0..ngroups) (total reads; < 0: one could not be built) in order, one wake for all
   (none if !wake: bmoe_lanes_wake does it); 1, or 0 (closed, or no memory) with the groups freed */
static int enqueue(lanes_t *L, int ngroups, grp **out, int total, int spec, int wake) {
    pthread_mutex_lock(&L->mu);
    if (L->closed || total < 0) {
        pthread_mutex_unlock(&L->mu);
        for (int j = 0; j < ngroups; j++) free(out[j]);
        return 0;
    }
    for (int j = 0; j < ngroups; j++)
        for (int i = 0; i < out[j]->n; i++) push_rd(spec ? &L->sh : &L->dh, spec ? &L->st : &L->dt, &out[j]->r[i]);
    /* one lane; it wakes the next (lane_main). Signalled after the unlock: a lane woken while the mutex is still
       held would block on it at once and need a second wake-up from the unlock */
    int signal = wake && total > 0 && L->idle > 0 && (!spec || L->spec_running < L->spec_max);
    pthread_mutex_unlock(&L->mu);
    if (signal) pthread_cond_signal(&L->work);
    return 1;
}

/* wake one idle lane if demand reads are queued (after bmoe_lanes_submit_layer with wake 0) */
void bmoe_lanes_wake(lanes_t *L) {
    pthread_mutex_lock(&L->mu);
    int signal = L->dh != NULL && L->idle > 0;
    pthread_mutex_unlock(&L->mu);
    if (signal) pthread_cond_signal(&L->work);
}

/* `ngroups` groups in one call (a layer's tensors): group j reads counts[j] slices of files[j], its reads
   (pos, len, addr) in turn in `reads`; one lock and one wake for all. out[j] = group j; 0 after close */
int bmoe_lanes_submit_groups(lanes_t *L, int ngroups, const int *files, const int *counts, const int64_t *reads,
                             int spec, grp **out) {
    int total = 0;
    for (int j = 0; j < ngroups; j++) {
        grp *g = out[j] = new_group(counts[j], spec);
        for (int i = 0; g && i < counts[j]; i++, total++) {
            rd *r = &g->r[i];
            r->file = files[j];
            r->pos = reads[3 * total];
            r->len = reads[3 * total + 1];
            r->addr = (char *)(uintptr_t)reads[3 * total + 2];
        }
        if (!g) ngroups = j, total = -1;
    }
    return enqueue(L, ngroups, out, total, spec, 1);
}

/* a tensor whose expert e's slice is nb2 bytes at file position pos0 + e * nb2 and lands at addr0 + e * nb2;
   returns its id for bmoe_lanes_submit_layer, or -1 (no memory) */
int bmoe_lanes_register(lanes_t *L, int file, int64_t pos0, int64_t nb2, uintptr_t addr0) {
    pthread_mutex_lock(&L->reg_mu);
    int id = -1;
    if (L->nreg == L->capreg) {
        int cap = L->capreg ? 2 * L->capreg : 256;
        tensor_t *t = realloc(L->reg, (size_t)cap * sizeof *t);
        if (t) L->reg = t, L->capreg = cap;
    }
    if (L->nreg < L->capreg) {
        id = L->nreg++;
        L->reg[id] = (tensor_t){file, pos0, nb2, (int64_t)addr0};
    }
    pthread_mutex_unlock(&L->reg_mu);
    return id;
}

/* the demand reads of experts[0..nexp) of each registered tensor ids[j], as bmoe_lanes_submit_groups given each
   tensor's slices (pos0 + e * nb2, nb2, addr0 + e * nb2) in the experts' order: out[j] = tensor j's group.
   1; 0 after close (or no memory); -1 if an id is not registered (nothing queued). wake 0: no lane is woken
   (the caller builds its futures first, then calls bmoe_lanes_wake: on a busy machine the woken lane may take
   the caller's CPU) */
int bmoe_lanes_submit_layer(lanes_t *L, int ntensors, const int *ids, int nexp, const int *experts, grp **out,
                            int wake) {
    pthread_mutex_lock(&L->reg_mu);
    for (int j = 0; j < ntensors; j++)
        if (ids[j] < 0 || ids[j] >= L->nreg) {
            pthread_mutex_unlock(&L->reg_mu);
            return -1;
        }
    int total = 0;
    for (int j = 0; j < ntensors; j++) {
        grp *g = out[j] = new_group(nexp, 0);
        if (!g) {
            ntensors = j, total = -1;
            break;
        }
        const tensor_t *t = &L->reg[ids[j]];
        for (int i = 0; i < nexp; i++, total++) {
            rd *r = &g->r[i];
            int64_t off = (int64_t)experts[i] * t->nb2;
            r->file = t->file;
            r->pos = t->pos0 + off;
            r->len = t->nb2;
            r->addr = (char *)(uintptr_t)(t->addr0 + off);
        }
    }
    pthread_mutex_unlock(&L->reg_mu);
    return enqueue(L, ntensors, out, total, 0, wake);
}

/* one group of n reads of file `file`: reads[3i..3i+2] = position, length, address; returns the group (NULL:
 * closed or no memory) */
grp *bmoe_lanes_submit(lanes_t *L, int file, int n, const int64_t *reads, int spec) {
    grp *g = NULL;
    return bmoe_lanes_submit_groups(L, 1, &file, &n, reads, spec, &g) ? g : NULL;
}

/* one read, without arrays */
grp *bmoe_lanes_submit1(lanes_t *L, int file, int64_t pos, int64_t len, uintptr_t addr, int spec) {
    int64_t r[3] = {pos, len, (int64_t)addr};
    return bmoe_lanes_submit(L, file, 1, r, spec);
}

int bmoe_lanes_done(lanes_t *L, grp *g) {
    pthread_mutex_lock(&L->mu);
    int d = g->remaining == 0;
    pthread_mutex_unlock(&L->mu);
    return d;
}

/* move the group's still-queued speculative reads to the end of the demand queue; returns how many moved */
int bmoe_lanes_promote(lanes_t *L, grp *g) {
    int moved = 0;
    pthread_mutex_lock(&L->mu);
    for (int i = 0; i < g->n; i++) {
        rd *r = &g->r[i];
        if (r->state == Q_SPEC) {
            unlink_rd(&L->sh, &L->st, r);
            r->state = Q_DEMAND;
            push_rd(&L->dh, &L->dt, r);
            moved++;
        }
    }
    if (moved) wake(L, moved, 0);
    pthread_mutex_unlock(&L->mu);
    return moved;
}

static void cancel_group(lanes_t *L, grp *g) {
    for (int i = 0; i < g->n; i++) {
        rd *r = &g->r[i];
        if (r->state == Q_SPEC) unlink_rd(&L->sh, &L->st, r);
        else if (r->state == Q_DEMAND) unlink_rd(&L->dh, &L->dt, r);
        else continue;
        r->state = CANCELLED;
        g->remaining--;
    }
    pthread_cond_broadcast(&L->done);
}

/* all of the groups' reads still queued as speculative: cancel them all (1); else change nothing (0) */
int bmoe_lanes_withdraw(lanes_t *L, int n, grp *const *gs) {
    pthread_mutex_lock(&L->mu);
    for (int k = 0; k < n; k++)
        for (int i = 0; i < gs[k]->n; i++)
            if (gs[k]->r[i].state != Q_SPEC) {
                pthread_mutex_unlock(&L->mu);
                return 0;
            }
    for (int k = 0; k < n; k++) cancel_group(L, gs[k]);
    pthread_mutex_unlock(&L->mu);
    return 1;
}

/* every read of the group still queued (either queue): cancel them (1); else nothing (0), as Future.cancel */
int bmoe_lanes_cancel(lanes_t *L, grp *g) {
    pthread_mutex_lock(&L->mu);
    for (int i = 0; i < g->n; i++)
        if (g->r[i].state != Q_SPEC && g->r[i].state != Q_DEMAND) {
            pthread_mutex_unlock(&L->mu);
            return 0;
        }
    cancel_group(L, g);
    pthread_mutex_unlock(&L->mu);
    return 1;
}

/* wait until no read of the group is queued or running; out[0..5]: bytes read, summed read ns, index of the first
 * failed read or -1, index of a read that fell back to buffered or -1, reads cancelled, reads done */
void bmoe_lanes_collect(lanes_t *L, grp *g, int64_t *out) {
    pthread_mutex_lock(&L->mu);
    while (g->remaining > 0) pthread_cond_wait(&L->done, &L->mu);
    pthread_mutex_unlock(&L->mu);
    int64_t got = 0, ns = 0, failed = -1, fell = -1, cancelled = 0, done = 0;
    for (int i = 0; i < g->n; i++) {
        rd *r = &g->r[i];
        if (r->state == CANCELLED) { cancelled++; continue; }
        done++;
        got += r->got;
        ns += r->ns;
        if (r->err && failed < 0) failed = i;
        if (r->fellback && fell < 0) fell = i;
    }
    out[0] = got; out[1] = ns; out[2] = failed; out[3] = fell; out[4] = cancelled; out[5] = done;
}

/* read i of a collected group: out[0..7] = got, t0, t1, lane, err, errpos, errlen, state */
void bmoe_lanes_detail(grp *g, int i, int64_t *out) {
    rd *r = &g->r[i];
    out[0] = r->got; out[1] = r->t0; out[2] = r->t1; out[3] = r->lane;
    out[4] = r->err; out[5] = r->errpos; out[6] = r->errlen; out[7] = r->state;
}

/* the caller is done with the group: freed now, or by the lane that finishes its last read */
void bmoe_lanes_release(lanes_t *L, grp *g) {
    pthread_mutex_lock(&L->mu);
    if (g->remaining == 0) free(g);
    else g->orphan = 1;
    pthread_mutex_unlock(&L->mu);
}

