/* The move kind of the page pool (--recycle-pages move): an evicted slice's whole pages stay where they are, anonymous
 * and charged as before, on a list of free ranges (`move_detach`, on the page releaser's thread: no system call); a
 * lane, before it reads a miss, moves pages of free ranges into the miss's whole pages with UFFDIO_MOVE, a page-table
 * move without zeroing, charging or a new mapping (`move_attach`). A miss that is itself on the list takes its own
 * pages back in place. The reservations are registered with a userfaultfd in write-protect mode, which UFFDIO_MOVE
 * needs of its destination and which traps nothing (no page is ever write-protected; a missing page faults as
 * before). The list holds at most `cap` bytes (the page releaser's batch, which the memory cgroup check counts) in at
 * most `max_attached` ranges; an eviction beyond that is released with MADV_DONTNEED, as without the pool. */
#include "clanes_pool_common.h"

#include <fcntl.h>
#include <linux/userfaultfd.h>
#include <sys/ioctl.h>
#include <sys/syscall.h>

#ifndef UFFDIO_MOVE  /* kernel headers older than 6.8: the 6.8 uABI */
struct uffdio_move {
    __u64 dst, src, len, mode;
    __s64 move;
};
#define _UFFDIO_MOVE (0x05)
#define UFFDIO_MOVE _IOWR(UFFDIO, _UFFDIO_MOVE, struct uffdio_move)
#define UFFDIO_MOVE_MODE_ALLOW_SRC_HOLES ((__u64)1 << 1)
#endif
#ifndef UFFD_FEATURE_MOVE
#define UFFD_FEATURE_MOVE (1 << 16)
#endif
#ifndef UFFD_USER_MODE_ONLY
#define UFFD_USER_MODE_ONLY 1
#endif

/* 0, or -1 with errno (ENOSYS/EPERM: no userfaultfd; EINVAL/ENOTSUP: no UFFDIO_MOVE in this kernel) */
int move_init(pool_t *P) {
    int fd = (int)syscall(SYS_userfaultfd, O_CLOEXEC | O_NONBLOCK | UFFD_USER_MODE_ONLY);
    if (fd < 0 && errno == EINVAL) fd = (int)syscall(SYS_userfaultfd, O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) return -1;
    struct uffdio_api api = {.api = UFFD_API, .features = UFFD_FEATURE_MOVE};
    if (ioctl(fd, UFFDIO_API, &api) != 0 || !(api.features & UFFD_FEATURE_MOVE)) {
        int e = errno ? errno : ENOTSUP;
        close(fd);
        errno = e;
        return -1;
    }
    P->uffd = fd;
    return 0;
}

/* register a reservation (page-aligned start; its end rounded up to a page): 0 or -errno */
int move_region(pool_t *P, uintptr_t lo, uintptr_t hi) {
    struct uffdio_register r = {.range = {.start = lo, .len = (hi - lo + PAGE - 1) / PAGE * PAGE},
                                .mode = UFFDIO_REGISTER_MODE_WP};
    return ioctl(P->uffd, UFFDIO_REGISTER, &r) == 0 ? 0 : -errno;
}

static void drop_range(pool_t *P, int64_t i) {  /* free range i off the list (swap with the last), mutex held */
    int64_t h = find(P, P->fa[i]);
    if (h >= 0) erase(P, h);
    P->free_bytes -= P->fn[i] * PAGE;
    int64_t last = --P->nf;
    if (i != last) {
        P->fa[i] = P->fa[last], P->fn[i] = P->fn[last];
        int64_t k = find(P, P->fa[i]);
        if (k >= 0) P->tab[k].off = i;
    }
}

static int is_busy(const pool_t *P, int64_t a) {
    for (int i = 0; i < P->nbusy; i++)
        if (P->busy[i] == a) return 1;
    return 0;
}

static void unbusy(pool_t *P, int64_t a) {
    for (int i = 0; i < P->nbusy; i++)
        if (P->busy[i] == a) {
            P->busy[i] = P->busy[--P->nbusy];
            break;
        }
    pthread_cond_broadcast(&P->busy_cv);
}

/* the whole pages [a, a + pages * PAGE) of a slice about to be read: 1 if pages were recycled into it (moved, or its
 * own taken back), 0 if none. Never a failure: a page the move could not bring is faulted by the read as without the
 * pool, and the bytes are the read's either way (a move that fails other than on a page already there, EEXIST, is
 * counted in ST_ERRORS) */
int move_attach(pool_t *P, int64_t a, int64_t pages) {
    pthread_mutex_lock(&P->mu);
    if (!in_region(P, a, a + pages * PAGE)) {
        pthread_mutex_unlock(&P->mu);
        return 0;
    }
    while (is_busy(P, a)) pthread_cond_wait(&P->busy_cv, &P->mu);  /* a lane moves this slice's old pages out */
    int64_t h = find(P, a);
    if (h >= 0) {  /* its own pages, still here: taken back in place */
        drop_range(P, P->tab[h].off);
        P->st[ST_RECYCLED]++;
        pthread_mutex_unlock(&P->mu);
        return 1;
    }
    int64_t done = 0;
    int rc = 0;
    while (done < pages && P->nf > 0 && P->nbusy < 64) {
        int64_t i = P->nf - 1, sa = P->fa[i], sn = P->fn[i];
        drop_range(P, i);
        P->busy[P->nbusy++] = sa;
        pthread_mutex_unlock(&P->mu);
        int64_t n = sn < pages - done ? sn : pages - done, moved = 0;
        int e = 0;
        for (int tries = 0; moved < n * PAGE && tries < 100; tries++) {
            struct uffdio_move m = {.dst = (__u64)(a + done * PAGE + moved), .src = (__u64)(sa + moved),
                                    .len = (__u64)(n * PAGE - moved), .mode = UFFDIO_MOVE_MODE_ALLOW_SRC_HOLES};
            if (ioctl(P->uffd, UFFDIO_MOVE, &m) == 0) {
                moved = n * PAGE;
                break;
            }
            e = errno;
            if (m.move > 0) moved += m.move;
            if (e != EAGAIN) break;
            e = 0;
        }
        if (moved < sn * PAGE)  /* what was not moved (more than the miss needed, or a failure): released */
            madvise((void *)(sa + moved), (size_t)(sn * PAGE - moved), MADV_DONTNEED);
        pthread_mutex_lock(&P->mu);
        unbusy(P, sa);
        if (moved > 0) rc = 1;
        if (e) {
            P->st[ST_ERRORS] += e != EEXIST;
            break;
        }
        done += n;
    }
    P->st[rc ? ST_RECYCLED : ST_FALLBACK]++;
    pthread_mutex_unlock(&P->mu);
    return rc;
}

/* an evicted slice's whole pages [a, a + n): kept on the list (1) while it holds under `cap` bytes and
 * `max_attached` ranges, else released with MADV_DONTNEED (0); -errno if that fails */
int move_detach(pool_t *P, int64_t a, int64_t n) {
    pthread_mutex_lock(&P->mu);
    if (find(P, a) < 0 && P->free_bytes + n <= P->cap && P->nf < P->max_attached) {
        if (P->nf == P->capf) {
            int64_t cap = P->capf ? 2 * P->capf : 256;
            int64_t *fa = realloc(P->fa, (size_t)cap * sizeof *fa), *fn = fa ? realloc(P->fn, (size_t)cap * sizeof *fn)
                                                                              : NULL;
            if (fa) P->fa = fa;
            if (fn) P->fn = fn, P->capf = cap;
        }
        if (P->nf < P->capf) {
            P->fa[P->nf] = a, P->fn[P->nf] = n / PAGE;
            insert(P, (slot_t){a, P->nf, 0, n / PAGE});
            P->nf++;
            P->free_bytes += n / PAGE * PAGE;
            P->st[ST_DETACHED]++;
            pthread_mutex_unlock(&P->mu);
            return 1;
        }
    }
    pthread_mutex_unlock(&P->mu);
    int rc = madvise((void *)a, (size_t)n, MADV_DONTNEED) == 0 ? 0 : -errno;
    pthread_mutex_lock(&P->mu);
    P->st[rc ? ST_ERRORS : ST_DONTNEED]++;
    pthread_mutex_unlock(&P->mu);
    return rc;
}
