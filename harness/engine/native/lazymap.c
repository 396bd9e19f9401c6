/* bmoe's optional mmap shim, loaded with LD_PRELOAD (the `bmoe` command re-executes itself once with it).
 *
 * llama.cpp maps a model file with MAP_POPULATE and then posix_madvise(WILLNEED)s the whole mapping, so a
 * load reads every byte of the file, routed experts included, though the streamed engine never touches
 * them through that mapping. This shim clears MAP_POPULATE, and drops the WILLNEED advice, for mappings
 * of the files named in the environment variable BMOE_LAZY_MAP ("dev:ino[,dev:ino...]", decimal st_dev and
 * st_ino, set by the engine just before the load). Every other mapping, and every process that does not
 * set the variable, is passed through unchanged. Pages are then read when first touched, which changes
 * when bytes are read, never which bytes a tensor holds.
 *
 * bmoe_lazymap_stats() reports what it did, so the engine can say in its CSV whether the shim acted. */

#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/types.h>

typedef void *(*mmap_fn)(void *, size_t, int, int, int, off_t);
typedef int (*madvise_fn)(void *, size_t, int);

#define MAX_RANGES 256
static uintptr_t range_beg[MAX_RANGES], range_end[MAX_RANGES];
static long n_ranges;           /* mappings made without MAP_POPULATE */
static long n_advice_skipped;   /* WILLNEED advice dropped inside them */

static int is_model_fd(int fd) {
    const char *want = getenv("BMOE_LAZY_MAP");
    struct stat st;
    if (!want || !*want || fd < 0 || fstat(fd, &st) != 0) {
        return 0;
    }
    const char *p = want;
    while (*p) {
        char *end;
        unsigned long long dev = strtoull(p, &end, 10);
        if (*end != ':') {
            return 0;
        }
        unsigned long long ino = strtoull(end + 1, &end, 10);
        if ((dev_t) dev == st.st_dev && (ino_t) ino == st.st_ino) {
            return 1;
        }
        if (*end != ',') {
            return 0;
        }
        p = end + 1;
    }
    return 0;
}

static void *lazy_map(mmap_fn real, void *addr, size_t len, int prot, int flags, int fd, off_t off) {
    if (!(flags & MAP_POPULATE) || (flags & MAP_ANONYMOUS) || !is_model_fd(fd)) {
        return real(addr, len, prot, flags, fd, off);
    }
    void *p = real(addr, len, prot, flags & ~MAP_POPULATE, fd, off);
    if (p != MAP_FAILED) {
        long i = __atomic_fetch_add(&n_ranges, 1, __ATOMIC_SEQ_CST);
        if (i < MAX_RANGES) {
            range_beg[i] = (uintptr_t) p;
            range_end[i] = (uintptr_t) p + len;
        }
    }
    return p;
}

void *mmap(void *addr, size_t len, int prot, int flags, int fd, off_t off) {
    static mmap_fn real;
    if (!real) {
        real = (mmap_fn) dlsym(RTLD_NEXT, "mmap");
    }
    return lazy_map(real, addr, len, prot, flags, fd, off);
}

void *mmap64(void *addr, size_t len, int prot, int flags, int fd, off_t off) {
    static mmap_fn real;
    if (!real) {
        real = (mmap_fn) dlsym(RTLD_NEXT, "mmap64");
    }
    return lazy_map(real, addr, len, prot, flags, fd, off);
}

static int in_lazy_range(void *addr, size_t len) {
    long n = __atomic_load_n(&n_ranges, __ATOMIC_SEQ_CST);
    uintptr_t b = (uintptr_t) addr, e = b + len;
    for (long i = 0; i < n && i < MAX_RANGES; i++) {
        if (b >= range_beg[i] && e <= range_end[i]) {
            return 1;
        }
    }
    return 0;
}

int posix_madvise(void *addr, size_t len, int advice) {
    static madvise_fn real;
    if (advice == POSIX_MADV_WILLNEED && in_lazy_range(addr, len)) {
        __atomic_fetch_add(&n_advice_skipped, 1, __ATOMIC_SEQ_CST);
        return 0;
    }
    if (!real) {
        real = (madvise_fn) dlsym(RTLD_NEXT, "posix_madvise");
    }
    return real(addr, len, advice);
}

void bmoe_lazymap_stats(long *maps, long *advice_skipped) {
    *maps = __atomic_load_n(&n_ranges, __ATOMIC_SEQ_CST);
    *advice_skipped = __atomic_load_n(&n_advice_skipped, __ATOMIC_SEQ_CST);
}

/* ---- a model file changed under the running engine -------------------------------------------------------
 *
 * Touching a page of a file mapping past the file's end (the model truncated, or replaced in place, while
 * the engine runs) raises SIGBUS, which kills the process without a word. bmoe_sigbus_install() names the
 * model files (their descriptors, opened by the caller and kept open, and the sizes they had at load); the
 * handler then writes one line saying which file shrank (or that a mapped read failed) and exits with
 * `code`. Only async-signal-safe calls (fstat, write, _exit) are made in the handler. This library is a
 * plain shared object: loading it with dlopen (not LD_PRELOAD) gives the handler without the mmap shim. */

#include <signal.h>
#include <stdbool.h>
#include <time.h>
#include <unistd.h>

#define MAX_WATCHED 64
static int watched_fd[MAX_WATCHED];
static long long watched_size[MAX_WATCHED];
static const char *watched_name[MAX_WATCHED];
static int n_watched;
static int sigbus_code = 4;

static size_t put(char *buf, size_t at, size_t cap, const char *s) {
    while (*s && at + 1 < cap) {
        buf[at++] = *s++;
    }
    return at;
}

static size_t put_num(char *buf, size_t at, size_t cap, long long v) {
    char tmp[24];
    int n = 0;
    if (v < 0) {
        at = put(buf, at, cap, "-");
        v = -v;
    }
    do {
        tmp[n++] = (char) ('0' + v % 10);
        v /= 10;
    } while (v && n < 23);
    while (n && at + 1 < cap) {
        buf[at++] = tmp[--n];
    }
    return at;
}

static int sigbus_fired = 0;
static int notify_fd = -1;
static int notify_grace_ms = 0;

static void on_sigbus(int sig, siginfo_t *si, void *uctx) {
    (void) sig;
    (void) si;
    (void) uctx;
    /* several threads may fault on the same truncated mapping at once: the first writes the line and exits,
     * the others wait for that exit (the handler stays installed: with SA_RESETHAND a second thread's SIGBUS
     * would kill the process with the default action before the first one's _exit) */
    if (__atomic_exchange_n(&sigbus_fired, 1, __ATOMIC_SEQ_CST)) {
        for (;;) pause();
    }
    if (notify_fd >= 0) {
        /* bmoe serve: its event loop answers the request in flight and exits with the code itself; this thread
         * (inside llama.cpp, without the GIL) waits, and says the line and exits only if that does not come */
        ssize_t nw = write(notify_fd, "B", 1);
        (void) nw;
        struct timespec step = {0, 10 * 1000 * 1000};
        for (int waited = 0; waited < notify_grace_ms; waited += 10) {
            nanosleep(&step, NULL);
        }
    }
    char buf[2048];
    size_t at = 0;
    const size_t cap = sizeof buf;
    int found = 0;
    at = put(buf, at, cap, "bmoe: error: ");
    for (int i = 0; i < n_watched; i++) {
        struct stat st;
        if (fstat(watched_fd[i], &st) == 0 && (long long) st.st_size != watched_size[i]) {
            at = put(buf, at, cap, watched_name[i]);
            at = put(buf, at, cap, " changed size under the running engine (");
            at = put_num(buf, at, cap, watched_size[i]);
            at = put(buf, at, cap, " bytes at load, ");
            at = put_num(buf, at, cap, (long long) st.st_size);
            at = put(buf, at, cap, " now)");
            found = 1;
            break;
        }
    }
    if (!found) {
        at = put(buf, at, cap, "a read through the model's file mapping failed (SIGBUS: the file was truncated, "
                               "replaced or its storage failed)");
    }
    at = put(buf, at, cap, "; do not change a model file while it runs: restore it and run again\n");
    ssize_t w = write(2, buf, at);
    (void) w;
    _exit(sigbus_code);
}

/* fds[i]: an open descriptor of names[i] (kept open by the caller), sizes[i]: its size at load. The names
 * must stay valid for the life of the process. Returns 0, or -1 when sigaction failed. */
int bmoe_sigbus_install(int n, const int *fds, const long long *sizes, const char **names, int code) {
    n_watched = 0;
    for (int i = 0; i < n && i < MAX_WATCHED; i++) {
        watched_fd[i] = fds[i];
        watched_size[i] = sizes[i];
        watched_name[i] = names[i];
        n_watched = i + 1;
    }
    sigbus_code = code;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_sigbus;
    sa.sa_flags = SA_SIGINFO | SA_NODEFER;
    sigemptyset(&sa.sa_mask);
    return sigaction(SIGBUS, &sa, NULL);
}

/* After bmoe_sigbus_install: the first fault writes one byte to `fd` and waits up to `grace_ms` for the process
 * to exit by itself (bmoe serve answers the request in flight first), before the line and the exit above. */
void bmoe_sigbus_notify(int fd, int grace_ms) {
    notify_grace_ms = grace_ms;
    __atomic_store_n(&notify_fd, fd, __ATOMIC_SEQ_CST);
}

/* ---- stopping llama.cpp inside one call ------------------------------------------------------------------
 *
 * llama.cpp's abort callback (llama_set_abort_callback): its compute threads call it between graph nodes, so it
 * must not take the GIL. It reads the int the caller points it at: non-zero stops the llama_decode in progress
 * (which then returns 2), as bmoe serve does on SIGTERM in the middle of a long prefill. */
bool bmoe_flag_is_set(void *flag) {
    return __atomic_load_n((int *) flag, __ATOMIC_RELAXED) != 0;
}
