/* The page pool of --recycle-pages (harness/engine/io/recycle.py): an evicted expert slice's physical pages go to the
 * next miss instead of being freed (madvise MADV_DONTNEED) and faulted, zeroed and charged again by the next read.
 *
 * The pages live in one memfd. A lane, before it reads a slice into an expert tensor's reservation (a registered
 * region), maps a free chunk of the memfd over the slice's whole pages with MAP_FIXED | MAP_SHARED | MAP_POPULATE:
 * a page-table change, no zeroing (`bmoe_pool_attach`). The page releaser, instead of MADV_DONTNEED, maps anonymous
 * memory back over the slice (the reservation's VMAs merge again) and returns the chunk (`bmoe_pool_detach`). The
 * tensor's virtual layout never changes: llama.cpp reads each expert at its fixed address.
 *
 * Chunks are carved from the memfd in `granule` pages, up to `cap` bytes in all (the cache budget plus the pages a
 * decode batch holds before its evictions are released: what the memory cgroup check counts), and at most
 * `max_attached` at once (two VMAs each, kept well under vm.max_map_count). A slice that finds no chunk is read into
 * plain anonymous pages as without the pool (counted as a fallback); its release is then MADV_DONTNEED. Boundary
 * pages shared with a neighbouring slice are never part of a chunk. Every call holds the pool's mutex except the
 * mmap itself. */
#include "clanes_pool_common.h"

static freelist_t *list_of(pool_t *P, int64_t cls, int create) {
    for (int i = 0; i < P->nfl; i++)
        if (P->fl[i].cls == cls) return &P->fl[i];
    if (!create || P->nfl == NCLASS) return NULL;
    freelist_t *f = &P->fl[P->nfl++];
    f->cls = cls;
    return f;
}

static int push_free(pool_t *P, int64_t cls, int64_t off) {
    freelist_t *f = list_of(P, cls, 1);
    if (!f) return -1;
    if (f->n == f->cap) {
        int cap = f->cap ? 2 * f->cap : 64;
        int64_t *o = realloc(f->off, (size_t)cap * sizeof *o);
        if (!o) return -1;
        f->off = o, f->cap = cap;
    }
    f->off[f->n++] = off;
    return 0;
}

static int64_t pop_free(pool_t *P, int64_t cls) {
    freelist_t *f = list_of(P, cls, 0);
    return f && f->n ? f->off[--f->n] : -1;
}

/* kind POOL_MEMFD: chunks of a memfd of `cap` bytes, at most max_attached at once; POOL_MOVE: evicted pages held up
 * to `cap` bytes in at most max_attached ranges. NULL on failure (errno: why) */
pool_t *bmoe_pool_new(int64_t cap, int64_t granule, int64_t max_attached, int kind, int noreserve) {
    pool_t *P = calloc(1, sizeof *P);
    if (!P) return NULL;
    P->kind = kind;
    P->anon_flags = MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | (noreserve ? MAP_NORESERVE : 0);
    P->fd = P->uffd = -1;
    int64_t size = 1;
    while (size < 2 * (max_attached + 1)) size *= 2;
    P->tab = calloc((size_t)size, sizeof *P->tab);
    int bad = !P->tab;
    if (!bad && kind == POOL_MOVE) {
        bad = move_init(P) != 0;
    } else if (!bad) {
        P->fd = memfd_create("bmoe-pool", MFD_CLOEXEC);
        bad = P->fd < 0 || ftruncate(P->fd, cap) != 0;
    }
    if (bad) {
        int e = errno;
        if (P->fd >= 0) close(P->fd);
        if (P->uffd >= 0) close(P->uffd);
        free(P->tab);
        free(P);
        errno = e;
        return NULL;
    }
    pthread_mutex_init(&P->mu, NULL);
    pthread_cond_init(&P->busy_cv, NULL);
    P->mask = size - 1;
    P->cap = cap;
    P->granule = granule > 0 ? granule : 1;
    P->max_attached = max_attached;
    return P;
}

/* an expert tensor's reservation [lo, hi): reads into it attach chunks. 0, -1 (no memory) or -errno (the move kind's
 * registration with userfaultfd failed) */
int bmoe_pool_region(pool_t *P, uintptr_t lo, uintptr_t hi) {
    if (P->kind == POOL_MOVE) {
        int e = move_region(P, lo, hi);
        if (e) return e;
    }
    pthread_mutex_lock(&P->mu);
    int rc = 0;
    if (P->nreg == P->capreg) {
        int cap = P->capreg ? 2 * P->capreg : 64;
        int64_t *l = realloc(P->lo, (size_t)cap * sizeof *l), *h = l ? realloc(P->hi, (size_t)cap * sizeof *h) : NULL;
        if (l) P->lo = l;
        if (h) P->hi = h, P->capreg = cap;
        if (!h) rc = -1;
    }
    if (rc == 0) {
        int i = P->nreg++;
        while (i > 0 && P->lo[i - 1] > (int64_t)lo) {
            P->lo[i] = P->lo[i - 1], P->hi[i] = P->hi[i - 1];
            i--;
        }
        P->lo[i] = (int64_t)lo, P->hi[i] = (int64_t)hi;
    }
    pthread_mutex_unlock(&P->mu);
    return rc;
}

/* before a read of `len` bytes to `addr`: map a chunk over its whole pages when it is in a region and not attached.
 * 1: a recycled chunk; 2: a fresh one (its pages are faulted once, here); 0: nothing done (outside the regions,
 * attached already, or no chunk: plain anonymous pages); -errno: the mapping failed (the range is anonymous again) */
int bmoe_pool_attach(pool_t *P, uintptr_t addr, int64_t len) {
    int64_t a = (int64_t)((addr + PAGE - 1) / PAGE * PAGE), b = (int64_t)((addr + (uintptr_t)len) / PAGE * PAGE);
    if (b <= a) return 0;
    if (P->kind == POOL_MOVE) return move_attach(P, a, (b - a) / PAGE);
    int64_t pages = (b - a) / PAGE, cls = (pages + P->granule - 1) / P->granule, got = -1, rc = 1;
    pthread_mutex_lock(&P->mu);
    if (!in_region(P, a, b) || find(P, a) >= 0) {
        pthread_mutex_unlock(&P->mu);
        return 0;
    }
    if (P->attached < P->max_attached) {
        got = pop_free(P, cls);
        if (got < 0 && (got = pop_free(P, cls + 1)) >= 0) cls++;
    }
    if (got < 0 && P->attached < P->max_attached && P->carved + cls * P->granule * PAGE <= P->cap) {
        got = P->carved;
        P->carved += cls * P->granule * PAGE;
        rc = 2;
    }
    if (got < 0) {
        P->st[ST_FALLBACK]++;
        pthread_mutex_unlock(&P->mu);
        return 0;
    }
    insert(P, (slot_t){a, got, cls, pages});
    P->attached++;
    pthread_mutex_unlock(&P->mu);
    void *m = mmap((void *)a, (size_t)(pages * PAGE), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED | MAP_POPULATE,
                   P->fd, (off_t)got);
    int e = m == MAP_FAILED ? errno : 0;
    if (e)  /* a failed MAP_FIXED may have unmapped the range: anonymous again, as the reservation is */
        mmap((void *)a, (size_t)(pages * PAGE), PROT_READ | PROT_WRITE, P->anon_flags, -1, 0);
    pthread_mutex_lock(&P->mu);
    if (e) {
        int64_t i = find(P, a);
        if (i >= 0) erase(P, i);
        P->attached--;
        push_free(P, cls, got);
        P->st[ST_ERRORS]++;
    } else {
        P->st[rc == 1 ? ST_RECYCLED : ST_FRESH]++;
    }
    pthread_mutex_unlock(&P->mu);
    return e ? -e : rc;
}

/* instead of madvise(MADV_DONTNEED) of the whole pages [a, a + n) of an evicted slice: an attached chunk goes back to
 * the pool (anonymous memory mapped over the range again), else MADV_DONTNEED. 1 or 0; -errno on failure */
int bmoe_pool_detach(pool_t *P, uintptr_t a, int64_t n) {
    if (P->kind == POOL_MOVE) return move_detach(P, (int64_t)a, n);
    pthread_mutex_lock(&P->mu);
    int64_t i = find(P, (int64_t)a);
    slot_t s = {0};
    if (i >= 0) {
        s = P->tab[i];
        erase(P, i);
    }
    pthread_mutex_unlock(&P->mu);
    if (i < 0) {
        int rc = madvise((void *)a, (size_t)n, MADV_DONTNEED) == 0 ? 0 : -errno;
        pthread_mutex_lock(&P->mu);
        P->st[rc ? ST_ERRORS : ST_DONTNEED]++;
        pthread_mutex_unlock(&P->mu);
        return rc;
    }
    void *m = mmap((void *)a, (size_t)(s.pages * PAGE), PROT_READ | PROT_WRITE, P->anon_flags, -1, 0);
    int e = m == MAP_FAILED ? errno : 0;
    pthread_mutex_lock(&P->mu);
    P->attached--;
    if (e) {
        P->st[ST_ERRORS]++;  /* the chunk stays mapped there: lost to the pool, never reused */
    } else {
        push_free(P, s.cls, s.off);
        P->st[ST_DETACHED]++;
    }
    pthread_mutex_unlock(&P->mu);
    return e ? -e : 1;
}

/* out[0..7]: recycled, fresh, fallback, detached, dontneed, errors (counts); attached now (move: ranges held); bytes
 * carved (move: the evicted pages held now) */
void bmoe_pool_stats(pool_t *P, int64_t *out) {
    pthread_mutex_lock(&P->mu);
    memcpy(out, P->st, sizeof P->st);
    out[ST_ATTACHED] = P->kind == POOL_MOVE ? P->nf : P->attached;
    out[ST_CARVED] = P->kind == POOL_MOVE ? P->free_bytes : P->carved;
    pthread_mutex_unlock(&P->mu);
}

/* the memfd is closed; chunks still mapped keep their pages until unmapped (the process's end) */
void bmoe_pool_free(pool_t *P) {
    if (P->fd >= 0) close(P->fd);
    if (P->uffd >= 0) close(P->uffd);  /* unregisters the reservations */
    free(P->fa);
    free(P->fn);
    pthread_cond_destroy(&P->busy_cv);
    for (int i = 0; i < P->nfl; i++) free(P->fl[i].off);
    free(P->tab);
    free(P->lo);
    free(P->hi);
    pthread_mutex_destroy(&P->mu);
    free(P);
}
