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
#include "clanes.h"

#include <sys/mman.h>

#define NCLASS 64
enum { ST_RECYCLED, ST_FRESH, ST_FALLBACK, ST_DETACHED, ST_DONTNEED, ST_ERRORS, ST_ATTACHED, ST_CARVED };

typedef struct {
    int64_t key, off, cls, pages;  /* key: the slice's first whole page (0: empty); cls: chunk size in granules */
} slot_t;

typedef struct {
    int64_t cls;
    int64_t *off;
    int n, cap;
} freelist_t;

struct pool {
    pthread_mutex_t mu;
    int fd;
    int64_t cap, carved, granule, max_attached, attached;
    freelist_t fl[NCLASS];
    int nfl;
    slot_t *tab;
    int64_t mask;  /* table size - 1 (a power of two) */
    int64_t *lo, *hi;  /* the registered regions, sorted by lo */
    int nreg, capreg;
    int64_t st[8];
};

pool_t *bmoe_pool_new(int64_t cap, int64_t granule, int64_t max_attached) {
    pool_t *P = calloc(1, sizeof *P);
    if (!P) return NULL;
    P->fd = memfd_create("bmoe-pool", MFD_CLOEXEC);
    int64_t size = 1;
    while (size < 2 * (max_attached + 1)) size *= 2;
    P->tab = calloc((size_t)size, sizeof *P->tab);
    if (P->fd < 0 || !P->tab || ftruncate(P->fd, cap) != 0) {
        int e = errno;
        if (P->fd >= 0) close(P->fd);
        free(P->tab);
        free(P);
        errno = e;
        return NULL;
    }
    pthread_mutex_init(&P->mu, NULL);
    P->mask = size - 1;
    P->cap = cap;
    P->granule = granule > 0 ? granule : 1;
    P->max_attached = max_attached;
    return P;
}

static int64_t slot_of(const pool_t *P, int64_t key) {
    return (int64_t)(((uint64_t)key >> 12) * 0x9E3779B97F4A7C15ull >> 20) & P->mask;
}

static int64_t find(const pool_t *P, int64_t key) {
    for (int64_t i = slot_of(P, key);; i = (i + 1) & P->mask) {
        if (P->tab[i].key == key) return i;
        if (P->tab[i].key == 0) return -1;
    }
}

static void insert(pool_t *P, slot_t s) {
    int64_t i = slot_of(P, s.key);
    while (P->tab[i].key != 0) i = (i + 1) & P->mask;
    P->tab[i] = s;
}

static void erase(pool_t *P, int64_t i) {  /* linear probing: shift the cluster's later entries back */
    P->tab[i].key = 0;
    for (int64_t j = (i + 1) & P->mask; P->tab[j].key != 0; j = (j + 1) & P->mask) {
        int64_t h = slot_of(P, P->tab[j].key);
        /* move j to i if its home h is not cyclically within (i, j] */
        if ((j > i && (h <= i || h > j)) || (j < i && (h <= i && h > j))) {
            P->tab[i] = P->tab[j];
            P->tab[j].key = 0;
            i = j;
        }
    }
}

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

/* [a, b) lies in one registered region */
static int in_region(const pool_t *P, int64_t a, int64_t b) {
    int lo = 0, hi = P->nreg;
    while (lo < hi) {  /* the last region with lo <= a */
        int mid = (lo + hi) / 2;
        if (P->lo[mid] <= a) lo = mid + 1; else hi = mid;
    }
    return lo > 0 && b <= P->hi[lo - 1];
}

/* an expert tensor's reservation [lo, hi): reads into it attach chunks. 0, or -1 (no memory) */
int bmoe_pool_region(pool_t *P, uintptr_t lo, uintptr_t hi) {
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
        mmap((void *)a, (size_t)(pages * PAGE), PROT_READ | PROT_WRITE,
             MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0);
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
    void *m = mmap((void *)a, (size_t)(s.pages * PAGE), PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0);
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

/* out[0..7]: recycled, fresh, fallback, detached, dontneed, errors (counts); attached now; bytes carved */
void bmoe_pool_stats(pool_t *P, int64_t *out) {
    pthread_mutex_lock(&P->mu);
    memcpy(out, P->st, sizeof P->st);
    out[ST_ATTACHED] = P->attached;
    out[ST_CARVED] = P->carved;
    pthread_mutex_unlock(&P->mu);
}

/* the memfd is closed; chunks still mapped keep their pages until unmapped (the process's end) */
void bmoe_pool_free(pool_t *P) {
    close(P->fd);
    for (int i = 0; i < P->nfl; i++) free(P->fl[i].off);
    free(P->tab);
    free(P->lo);
    free(P->hi);
    pthread_mutex_destroy(&P->mu);
    free(P);
}
