/* Read lanes without the GIL: pthreads doing pread into place, two priorities (harness/engine/io/clanes.py).
 *
 * A reader hands a group of reads (one tensor's missed slices, or one speculative read) to `bmoe_lanes_submit`;
 * lane threads take them from two FIFO queues exactly as harness.engine.io.lanes.PriorityLanes does: the oldest
 * demand read first; a speculative one only when no demand read is queued and fewer than spec_max speculative
 * reads run. A queued speculative group can be promoted (moved to the end of the demand queue), withdrawn (all
 * or none) or cancelled. The caller waits for a group with `bmoe_lanes_collect` (called through ctypes, so the
 * GIL is released while it blocks); nothing here ever touches Python.
 * A read on an O_DIRECT descriptor reads the page-aligned superset of its slice (the destination is congruent
 * to the file offset); EINVAL at its first byte switches that file to buffered reads for good (`fellback`).
 * Each read keeps its start and finish time (CLOCK_MONOTONIC ns, as time.perf_counter_ns), its errno and where
 * it failed, for the caller to report.
 * This file: the lanes themselves (new, the lane threads, one read into place, close, the tests' hold jobs);
 * clanes_groups.c: a group of reads from submit to release (queue, promote, withdraw, cancel, collect).
 */
#include "clanes_common.h"

#include <stdio.h>

int bmoe_lanes_version(void) { return 5; }  /* 3: submit_groups; 4: register, submit_layer; 5: pool, tids */

static int64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* 0 on success; else r->err (errno or ERR_SHORT), r->errpos, r->errlen say where */
static int read_fd(rd *r, int fd, int64_t start, int64_t want, int64_t need, char *dest) {
    int64_t got = 0;
    while (got < need) {
        ssize_t n = pread(fd, dest + got, (size_t)(want - got), (off_t)(start + got));
        if (n < 0) {
            if (errno == EINTR) continue;
            r->err = errno; r->errpos = start + got; r->errlen = want - got; r->got = got;
            return -1;
        }
        if (n == 0) {
            r->err = ERR_SHORT; r->errpos = start + got; r->errlen = want - got; r->got = got;
            return -1;
        }
        got += n;
    }
    r->got = got;
    return 0;
}

static void hold(lanes_t *L, rd *r) {
    pthread_mutex_lock(&L->mu);
    if (++L->holding > L->hold_peak) L->hold_peak = L->holding;
    while (!((L->released >> (r->pos & 63)) & 1)) pthread_cond_wait(&L->hold_cv, &L->mu);
    L->holding--;
    pthread_mutex_unlock(&L->mu);
}

static void do_read(lanes_t *L, rd *r) {
    r->t0 = now_ns();
    if (r->file < 0) {
        hold(L, r);
        goto out;
    }
    pool_t *pool = __atomic_load_n(&L->pool, __ATOMIC_ACQUIRE);
    if (pool) {  /* --recycle-pages: the slice's whole pages become a recycled chunk of the pool before the read */
        int rc = bmoe_pool_attach(pool, (uintptr_t)r->addr, r->len);
        if (rc < 0) {
            r->err = -rc; r->errpos = r->pos; r->errlen = r->len; r->got = 0;
            goto out;
        }
    }
    file_t *f = &L->files[r->file];
    int fdd = __atomic_load_n(&f->fd_direct, __ATOMIC_RELAXED);
    if (fdd >= 0) {
        int64_t a = r->pos / PAGE * PAGE;
        int64_t b = (r->pos + r->len + PAGE - 1) / PAGE * PAGE, end = (f->size + PAGE - 1) / PAGE * PAGE;
        if (b > end) b = end;
        if (read_fd(r, fdd, a, b - a, r->pos + r->len - a, r->addr - (r->pos - a)) == 0) goto out;
        if (r->got != 0 || r->err != EINVAL) goto out;
        r->err = 0;  /* EINVAL at the first byte: a filesystem that accepted the open; read buffered */
        r->fellback = 1;
        __atomic_store_n(&f->fd_direct, -1, __ATOMIC_RELAXED);
    }
    read_fd(r, f->fd_buf, r->pos, r->len, r->len, r->addr);
out:
    r->t1 = now_ns();
    r->ns = r->t1 - r->t0;
}

typedef struct {
    lanes_t *L;
    int lane;
} lane_arg;

static void *lane_main(void *p) {
    lane_arg *a = p;
    lanes_t *L = a->L;
    int lane = a->lane;
    free(a);
    char name[16];
    snprintf(name, sizeof name, "bmoe-lane-%d", lane);
    pthread_setname_np(pthread_self(), name);
    pthread_mutex_lock(&L->mu);
    L->tids[lane] = (int)gettid();
    L->started++;
    pthread_cond_broadcast(&L->done);  /* bmoe_lanes_new waits for every lane's id */
    for (;;) {
        rd *r = NULL;
        if (L->dh) {
            r = L->dh;
            unlink_rd(&L->dh, &L->dt, r);
        } else if (L->sh && L->spec_running < L->spec_max) {
            r = L->sh;
            unlink_rd(&L->sh, &L->st, r);
            r->spec_taken = 1;
            L->spec_running++;
        } else if (L->closed) {
            break;
        } else {
            L->idle++;
            pthread_cond_wait(&L->work, &L->mu);
            L->idle--;
            continue;
        }
        r->state = RUNNING;
        r->lane = lane;
        /* chained wake-up: a submit wakes one lane, and each lane that takes a read wakes the next while work
           is queued, so the submitting (compute) thread pays for one wake-up, not one per lane (each costs it
           tens of us on a VM, where a wake-up on another CPU is an interrupt between virtual CPUs) */
        if (L->idle && (L->dh || (L->sh && L->spec_running < L->spec_max))) pthread_cond_signal(&L->work);
        pthread_mutex_unlock(&L->mu);
        do_read(L, r);
        pthread_mutex_lock(&L->mu);
        r->state = DONE;
        if (r->spec_taken) {
            L->spec_running--;
            if (L->sh && L->idle) pthread_cond_signal(&L->work);  /* a queued speculative read may start */
        }
        grp *g = r->g;
        if (--g->remaining == 0) {
            if (g->orphan) free(g);
            else pthread_cond_broadcast(&L->done);
        }
    }
    pthread_mutex_unlock(&L->mu);
    return NULL;
}

/* fd_direct[i] < 0: no O_DIRECT descriptor for file i */
lanes_t *bmoe_lanes_new(int lanes, int spec_max, int nfiles, const int *fd_buf, const int *fd_direct,
                        const int64_t *size) {
    lanes_t *L = calloc(1, sizeof *L);
    if (!L) return NULL;
    pthread_mutex_init(&L->mu, NULL);
    pthread_cond_init(&L->work, NULL);
    pthread_cond_init(&L->done, NULL);
    pthread_cond_init(&L->hold_cv, NULL);
    pthread_mutex_init(&L->reg_mu, NULL);
    L->spec_max = spec_max;
    L->nfiles = nfiles;
    L->files = calloc((size_t)(nfiles > 0 ? nfiles : 1), sizeof *L->files);
    L->th = calloc((size_t)lanes, sizeof *L->th);
    L->tids = calloc((size_t)lanes, sizeof *L->tids);
    for (int i = 0; i < nfiles; i++) {
        L->files[i].fd_buf = fd_buf[i];
        L->files[i].fd_direct = fd_direct[i];
        L->files[i].size = size[i];
    }
    /* the lanes never take a signal: they inherit a mask blocking all, so a SIGINT (Ctrl-C) goes to the
       interpreter's thread, which may be blocked reading the terminal, and not to a lane that would leave it
       sleeping there */
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, &old);
    for (int i = 0; i < lanes; i++) {
        lane_arg *a = malloc(sizeof *a);
        a->L = L;
        a->lane = i;
        if (pthread_create(&L->th[i], NULL, lane_main, a) != 0) {
            free(a);
            break;
        }
        L->nthreads++;
    }
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    pthread_mutex_lock(&L->mu);
    while (L->started < L->nthreads) pthread_cond_wait(&L->done, &L->mu);
    pthread_mutex_unlock(&L->mu);
    return L;
}

/* --recycle-pages: reads into the pool's regions attach a chunk first (set before any such read) */
void bmoe_lanes_set_pool(lanes_t *L, pool_t *P) { __atomic_store_n(&L->pool, P, __ATOMIC_RELEASE); }

/* the lanes' thread ids (0: not started yet); returns how many lanes */
int bmoe_lanes_tids(lanes_t *L, int *out) {
    pthread_mutex_lock(&L->mu);
    for (int i = 0; i < L->nthreads; i++) out[i] = L->tids[i];
    pthread_mutex_unlock(&L->mu);
    return L->nthreads;
}

int bmoe_lanes_direct(lanes_t *L, int file) { return __atomic_load_n(&L->files[file].fd_direct, __ATOMIC_RELAXED) >= 0; }

/* cancel the queued speculative reads, finish the demand ones, stop the lanes (L stays valid for release) */
void bmoe_lanes_close(lanes_t *L) {
    pthread_mutex_lock(&L->mu);
    if (L->closed) {
        pthread_mutex_unlock(&L->mu);
        return;
    }
    L->closed = 1;
    while (L->sh) {
        rd *r = L->sh;
        unlink_rd(&L->sh, &L->st, r);
        r->state = CANCELLED;
        if (--r->g->remaining == 0 && r->g->orphan) free(r->g);
    }
    pthread_cond_broadcast(&L->work);
    pthread_cond_broadcast(&L->done);
    pthread_mutex_unlock(&L->mu);
    for (int i = 0; i < L->nthreads; i++) pthread_join(L->th[i], NULL);
}

/* for tests: a job (file -1) that holds its lane until bmoe_lanes_release_hold(id); how many lanes hold now, and
 * the most that ever held at once */
grp *bmoe_lanes_submit_hold(lanes_t *L, int id, int spec) { return bmoe_lanes_submit1(L, -1, id, 0, 0, spec); }

void bmoe_lanes_release_hold(lanes_t *L, int id) {
    pthread_mutex_lock(&L->mu);
    L->released |= (uint64_t)1 << (id & 63);
    pthread_cond_broadcast(&L->hold_cv);
    pthread_mutex_unlock(&L->mu);
}

void bmoe_lanes_holding(lanes_t *L, int *out) {
    pthread_mutex_lock(&L->mu);
    int queued = 0;
    for (rd *r = L->sh; r; r = r->next) queued++;
    out[0] = L->holding; out[1] = L->hold_peak; out[2] = queued;
    pthread_mutex_unlock(&L->mu);
}
