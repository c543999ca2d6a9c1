/* The thread pool of the large calls: a caller that never waits for an idle
   worker.

   posenc_parallel_for(n, threads, fn, ctx) runs fn(ctx, i, slot) for every
   item i in [0, n).  The caller publishes the call and starts on the items
   itself at once; workers (pthreads started on first use, asleep between
   calls) join when they get a core, each claiming one item at a time from
   the same counter.  When no item is left unclaimed the caller waits only for
   the items workers have claimed and are running; a worker that wakes late
   finds nothing left and goes back to sleep.  So a call with a busy
   neighbour costs at most one thread's time plus the items in flight, never
   a fork/join barrier waiting for a thread that has no core (OpenMP's team
   does that: 10-40x one thread's time on a shared 2-core machine).

   `slot` is 0 for the caller and 1..threads-1 for the workers admitted to
   the call: per-thread scratch is indexed by it.  Items run in any order,
   each once.  One call uses the pool at a time; a call that finds it busy
   (another Python thread's call, free-threaded or without the GIL) runs all
   its items on its own thread rather than wait.  Without pthreads and GCC
   atomics (MSVC) every call runs on its caller's thread.

   The state lives in one static record reused by every call, stamped with a
   generation: a worker claims an item or an admission with a compare-and-
   swap of (generation, counter), so a worker that slept through a call can
   never touch the next one's items, and the caller never waits for a worker
   to let go of the record.  Compiled into _core only (portable flags). */
#ifndef POSENC_POOL_H
#define POSENC_POOL_H

#include "posenc_config.h"

typedef void (*posenc_item_fn)(void* ctx, Py_ssize_t item, int slot);

#if defined(__GNUC__) && !defined(_WIN32)
#define POSENC_POOL 1
#include <pthread.h>
#include <sched.h>

/* Workers the pool starts at most: _threads.MAX_KERNEL_THREADS - 1 (started
   on first use, only as many as a call asks for). */
#define POSENC_POOL_MAX_WORKERS 32767
/* Polls of the in-flight counter between sched_yield() calls while the caller
   waits for the items workers are running. */
#define POSENC_POOL_SPINS 64

#define POSENC_POOL_GEN(word) ((word) >> 32)
#define POSENC_POOL_COUNT(word) ((word) & 0xffffffffu)

static struct {
    /* (generation << 32) | items left unclaimed, and | admissions left. */
    uint64_t claim, admit;
    int64_t done;                      /* items finished in this generation */
    int busy;                          /* a call owns the pool */
    /* The call; written by its caller before the generation is published. */
    posenc_item_fn fn;
    void* ctx;
    uint32_t n;                        /* items */
    uint32_t generation;               /* last published, under lock */
    int started;                       /* workers running, under lock */
    /* Test hooks (posenc_pool_hold): hold admitted workers back. */
    int hold;
    int64_t worker_items;              /* items run by workers, ever */
    pthread_mutex_t lock;
    pthread_cond_t wake;
    pthread_cond_t held;
} posenc_pool = {0, 0, 0, 0, NULL, NULL, 0, 0, 0, 0, 0,
                 PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, PTHREAD_COND_INITIALIZER};

static inline int posenc_pool_cas(uint64_t* word, uint64_t expected, uint64_t wanted) {
    return __atomic_compare_exchange_n(word, &expected, wanted, 0, __ATOMIC_ACQ_REL,
                                       __ATOMIC_ACQUIRE);
}

/* Takes one from the count of a word of generation `gen`: returns the count
   before (>= 1), or 0 when none is left or the generation has moved on.  The
   count lives in the word itself, so a worker that slept through a call never
   acts on another call's fields. */
static inline uint32_t posenc_pool_take(uint64_t* word_address, uint32_t gen) {
    uint64_t word = __atomic_load_n(word_address, __ATOMIC_ACQUIRE);
    while (POSENC_POOL_GEN(word) == gen && POSENC_POOL_COUNT(word) > 0) {
        if (posenc_pool_cas(word_address, word, word - 1)) return (uint32_t)POSENC_POOL_COUNT(word);
        word = __atomic_load_n(word_address, __ATOMIC_ACQUIRE);
    }
    return 0;
}

/* A worker's part in generation `gen`: an admission (its slot), then items
   until none is left.  fn and ctx are read only after an item of `gen` is
   claimed: until that item is done the caller cannot begin the next call. */
static void posenc_pool_join(uint32_t gen) {
    uint32_t left, slot = posenc_pool_take(&posenc_pool.admit, gen);
    if (slot == 0) return;
    if (__atomic_load_n(&posenc_pool.hold, __ATOMIC_ACQUIRE)) {  /* test hook: a worker with no core */
        pthread_mutex_lock(&posenc_pool.lock);
        while (posenc_pool.hold) pthread_cond_wait(&posenc_pool.held, &posenc_pool.lock);
        pthread_mutex_unlock(&posenc_pool.lock);
    }
    while ((left = posenc_pool_take(&posenc_pool.claim, gen)) > 0) {
        posenc_pool.fn(posenc_pool.ctx, (Py_ssize_t)(posenc_pool.n - left), (int)slot);
        __atomic_fetch_add(&posenc_pool.worker_items, 1, __ATOMIC_RELAXED);
        __atomic_fetch_add(&posenc_pool.done, 1, __ATOMIC_RELEASE);
    }
}

static void* posenc_pool_worker(void* unused) {
    uint32_t seen;
    (void)unused;
    pthread_mutex_lock(&posenc_pool.lock);
    seen = posenc_pool.generation;
    for (;;) {
        while (posenc_pool.generation == seen) pthread_cond_wait(&posenc_pool.wake, &posenc_pool.lock);
        seen = posenc_pool.generation;
        pthread_mutex_unlock(&posenc_pool.lock);
        posenc_pool_join(seen);
        pthread_mutex_lock(&posenc_pool.lock);
    }
    return NULL;
}

/* After fork() the child has no workers and may have inherited a held lock. */
static void posenc_pool_after_fork(void) {
    pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
    pthread_cond_t cond = PTHREAD_COND_INITIALIZER;
    posenc_pool.lock = lock;
    posenc_pool.wake = cond;
    posenc_pool.held = cond;
    posenc_pool.started = 0;
    posenc_pool.busy = 0;
    posenc_pool.hold = 0;
}

/* Starts workers up to `wanted` (under lock); returns how many run. */
static int posenc_pool_start(int wanted) {
    static int registered = 0;
    pthread_t thread;
    pthread_attr_t attr;
    if (!registered) registered = pthread_atfork(NULL, NULL, posenc_pool_after_fork) == 0;
    if (posenc_pool.started >= wanted || pthread_attr_init(&attr) != 0) return posenc_pool.started;
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    pthread_attr_setstacksize(&attr, 256 * 1024);
    while (posenc_pool.started < wanted && pthread_create(&thread, &attr, posenc_pool_worker, NULL) == 0)
        posenc_pool.started++;
    pthread_attr_destroy(&attr);
    return posenc_pool.started;
}

static void posenc_parallel_for(Py_ssize_t n, int threads, posenc_item_fn fn, void* ctx) {
    uint32_t left;
    uint64_t gen;
    int workers, spins = 0;
    if (threads > n) threads = (int)n;
    if (threads > POSENC_POOL_MAX_WORKERS + 1) threads = POSENC_POOL_MAX_WORKERS + 1;
    if (threads < 2 || n > 0xffffffffLL || __atomic_exchange_n(&posenc_pool.busy, 1, __ATOMIC_ACQUIRE)) {
        for (Py_ssize_t i = 0; i < n; i++) fn(ctx, i, 0);
        return;
    }
    pthread_mutex_lock(&posenc_pool.lock);
    workers = posenc_pool_start(threads - 1);
    if (workers > threads - 1) workers = threads - 1;
    gen = (uint64_t)(uint32_t)(posenc_pool.generation + 1);
    posenc_pool.fn = fn;
    posenc_pool.ctx = ctx;
    posenc_pool.n = (uint32_t)n;
    __atomic_store_n(&posenc_pool.done, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&posenc_pool.admit, gen << 32 | (uint64_t)workers, __ATOMIC_RELEASE);
    __atomic_store_n(&posenc_pool.claim, gen << 32 | (uint64_t)n, __ATOMIC_RELEASE);
    posenc_pool.generation = (uint32_t)gen;
    if (workers > 0) pthread_cond_broadcast(&posenc_pool.wake);
    pthread_mutex_unlock(&posenc_pool.lock);
    while ((left = posenc_pool_take(&posenc_pool.claim, (uint32_t)gen)) > 0) {
        fn(ctx, n - (Py_ssize_t)left, 0);
        __atomic_fetch_add(&posenc_pool.done, 1, __ATOMIC_RELEASE);
    }
    /* Every item is claimed: wait for those workers are running. */
    while (__atomic_load_n(&posenc_pool.done, __ATOMIC_ACQUIRE) < (int64_t)n) {
        if (++spins % POSENC_POOL_SPINS == 0) sched_yield();
    }
    __atomic_store_n(&posenc_pool.busy, 0, __ATOMIC_RELEASE);
}

/* Test hooks: hold admitted workers back (a worker that has no core), and
   count the items workers ran. */
static void posenc_pool_hold(int hold) {
    pthread_mutex_lock(&posenc_pool.lock);
    __atomic_store_n(&posenc_pool.hold, hold, __ATOMIC_RELEASE);
    if (!hold) pthread_cond_broadcast(&posenc_pool.held);
    pthread_mutex_unlock(&posenc_pool.lock);
}

static int64_t posenc_pool_worker_items(void) {
    return __atomic_load_n(&posenc_pool.worker_items, __ATOMIC_RELAXED);
}

#else  /* no pool: every call on its caller's thread */
#define POSENC_POOL 0
static void posenc_parallel_for(Py_ssize_t n, int threads, posenc_item_fn fn, void* ctx) {
    (void)threads;
    for (Py_ssize_t i = 0; i < n; i++) fn(ctx, i, 0);
}
static void posenc_pool_hold(int hold) { (void)hold; }
static int64_t posenc_pool_worker_items(void) { return 0; }
#endif

#endif
