/* The read lanes' shared declarations (clanes.c: the lanes and their threads; clanes_groups.c: groups of reads,
 * from submit to release). One library, harness.engine.native._clanes, loaded with ctypes. Named after no source file:
 * a file that includes it depends on these declarations, not on clanes.c (which calls clanes_groups.c; a header named
 * clanes.h would be clanes.c's, and its includers and clanes.c would depend on each other: tests/engine/
 * test_structure.py refuses a cycle of C files). */
#ifndef BMOE_CLANES_COMMON_H
#define BMOE_CLANES_COMMON_H

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
typedef struct pool pool_t;  /* clanes_pool.c: the recycled pages of --recycle-pages */
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
    pool_t *pool;  /* --recycle-pages: each read attaches a chunk of it first (bmoe_lanes_set_pool), or NULL */
    int *tids;  /* each lane's thread id (its CPU time is read from /proc/self/task/<tid>/stat) */
    int started;  /* lanes that have set theirs (bmoe_lanes_new waits for all) */
} lanes_t;

/* a registered tensor: expert e's slice is nb2 bytes at file position pos0 + e * nb2, read to addr0 + e * nb2 */
typedef struct tensor_t {
    int file;
    int64_t pos0, nb2, addr0;
} tensor_t;

/* the queues are doubly linked lists of reads, head and tail */
static inline void unlink_rd(rd **h, rd **t, rd *r) {
    if (r->prev) r->prev->next = r->next; else *h = r->next;
    if (r->next) r->next->prev = r->prev; else *t = r->prev;
    r->prev = r->next = NULL;
}

static inline void push_rd(rd **h, rd **t, rd *r) {
    r->next = NULL;
    r->prev = *t;
    if (*t) (*t)->next = r; else *h = r;
    *t = r;
}

/* clanes_groups.c: one read without arrays (the hold jobs of the tests go through it) */
grp *bmoe_lanes_submit1(lanes_t *L, int file, int64_t pos, int64_t len, uintptr_t addr, int spec);

/* clanes_pool.c */
int bmoe_pool_attach(pool_t *P, uintptr_t addr, int64_t len);

#endif
