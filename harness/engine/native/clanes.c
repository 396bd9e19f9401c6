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
 */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define PAGE 4096
enum { Q_DEMAND = 1, Q_SPEC = 2, RUNNING = 3, DONE = 4, CANCELLED = 5 };
#define ERR_SHORT (-1)

typedef struct grp grp;
typedef struct rd {
    struct rd *prev, *next;
    grp *g;
    int file, state, spec_taken, lane, err, fellback;
    int64_t pos, len, errpos, errlen, got, ns, t0, t1;
    char *addr;
} rd;

struct grp {
    int n, remaining, orphan, spec;
    rd r[];
};

typedef struct {
    int fd_buf, fd_direct;
    int64_t size;
} file_t;

typedef struct {
    pthread_mutex_t mu;
    pthread_cond_t work, done;
    rd *dh, *dt, *sh, *st;
    int spec_running, spec_max, closed, nthreads, nfiles, idle;
    pthread_t *th;
    file_t *files;
    pthread_cond_t hold_cv;  /* tests: lanes held by hold jobs (file -1) until released */
    uint64_t released;
    int holding, hold_peak;
    pthread_mutex_t reg_mu;  /* the registered tensors (bmoe_lanes_register), read by bmoe_lanes_submit_layer */
    struct tensor_t *reg;
    int nreg, capreg;
} lanes_t;

/* a registered tensor: expert e's slice is nb2 bytes at file position pos0 + e * nb2, read to addr0 + e * nb2 */
typedef struct tensor_t {
    int file;
    int64_t pos0, nb2, addr0;
} tensor_t;

typedef struct {
    lanes_t *L;
    int lane;
} lane_arg;

int bmoe_lanes_version(void) { return 4; }  /* 3: submit_groups; 4: register, submit_layer */

static int64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static void unlink_rd(rd **h, rd **t, rd *r) {
    if (r->prev) r->prev->next = r->next; else *h = r->next;
    if (r->next) r->next->prev = r->prev; else *t = r->prev;
    r->prev = r->next = NULL;
}

static void push_rd(rd **h, rd **t, rd *r) {
    r->next = NULL;
    r->prev = *t;
    if (*t) (*t)->next = r; else *h = r;
    *t = r;
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

static void *lane_main(void *p) {
    lane_arg *a = p;
    lanes_t *L = a->L;
    int lane = a->lane;
    free(a);
    pthread_mutex_lock(&L->mu);
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
    return L;
}

int bmoe_lanes_direct(lanes_t *L, int file) { return __atomic_load_n(&L->files[file].fd_direct, __ATOMIC_RELAXED) >= 0; }

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
