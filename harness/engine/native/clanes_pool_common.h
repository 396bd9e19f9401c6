/* The page pool of --recycle-pages, shared by its two kinds (clanes_pool.c: the pool, the memfd kind and the calls the
 * lanes and the page releaser make; clanes_move.c: the move kind, UFFDIO_MOVE of an evicted slice's anonymous pages).
 * Named after no source file, as clanes_common.h: clanes_pool.c calls clanes_move.c, which includes this. */
#ifndef BMOE_CLANES_POOL_COMMON_H
#define BMOE_CLANES_POOL_COMMON_H

#include "clanes_common.h"

#include <sys/mman.h>

#define NCLASS 64
enum { POOL_MEMFD = 0, POOL_MOVE = 1 };
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
    int anon_flags;  /* how the reservations were mapped (MAP_NORESERVE or not): the same when mapped back, so the
                        VMAs merge again */
    /* the move kind (clanes_move.c): evicted slices' whole pages, kept as they are until a miss takes them */
    int kind, uffd;  /* kind: POOL_MEMFD or POOL_MOVE */
    int64_t *fa, *fn;  /* free ranges: first page, pages */
    int64_t nf, capf, free_bytes;
    int64_t busy[64];  /* ranges whose pages a lane is moving out now */
    int nbusy;
    pthread_cond_t busy_cv;
};

static inline int64_t slot_of(const pool_t *P, int64_t key) {
    return (int64_t)(((uint64_t)key >> 12) * 0x9E3779B97F4A7C15ull >> 20) & P->mask;
}

static inline int64_t find(const pool_t *P, int64_t key) {
    for (int64_t i = slot_of(P, key);; i = (i + 1) & P->mask) {
        if (P->tab[i].key == key) return i;
        if (P->tab[i].key == 0) return -1;
    }
}

static inline void insert(pool_t *P, slot_t s) {
    int64_t i = slot_of(P, s.key);
    while (P->tab[i].key != 0) i = (i + 1) & P->mask;
    P->tab[i] = s;
}

static inline void erase(pool_t *P, int64_t i) {  /* linear probing: shift the cluster's later entries back */
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

/* [a, b) lies in one registered region */
static inline int in_region(const pool_t *P, int64_t a, int64_t b) {
    int lo = 0, hi = P->nreg;
    while (lo < hi) {  /* the last region with lo <= a */
        int mid = (lo + hi) / 2;
        if (P->lo[mid] <= a) lo = mid + 1; else hi = mid;
    }
    return lo > 0 && b <= P->hi[lo - 1];
}

/* clanes_move.c */
int move_init(pool_t *P);
int move_region(pool_t *P, uintptr_t lo, uintptr_t hi);
int move_attach(pool_t *P, int64_t a, int64_t pages);
int move_detach(pool_t *P, int64_t a, int64_t n);

#endif
