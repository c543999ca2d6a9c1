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
   to let go of the record.  Compiled into _core only (portable flags).

   Beside a busy neighbour four things made a call wait for a worker
   without a core (issue 19; 4 MiB calls beside a CPU-bound process had a p99
   30-60x one thread's), and each has its remedy:
   - waking the workers: glibc's pthread_cond_broadcast waits until the
     waiters an earlier broadcast woke have run.  On Linux the caller wakes
     them with a futex on the generation word instead, which never blocks.
   - a woken worker taking the caller's core: workers run as SCHED_BATCH
     (Linux), which never preempts a running thread on wake-up; a worker
     takes a core that is idle, or its turn at a scheduler tick.
   - that turn, on the caller's CPU: the worker would run items while its
     caller waits for the core (beside a nice-19 busy process on a loaded
     2-core machine, 100 of the 103 calls in 3000 where a worker ran items
     took over 1 ms, 8x the median; 5 of the other 2897).  A worker
     that finds itself on the CPU its caller published the call from leaves
     the call to the caller.
   - a worker that loses its core while it runs an item.  A claimed item
     cannot be taken back (an in-place item computed twice would be wrong,
     and no worker may write after the call returned), so the caller waits
     for it, up to a scheduler slice.  A back-off keeps that rare; it is
     decided by counts of calls, and its only measurement compares two times
     of the same call.  A call is late when, having run out of items, its
     caller has waited longer than it worked (threads did not pay); the
     workers still running an item then are late.  After a late call the
     next `period` calls that ask for threads run on that many threads less
     (on the caller alone with 2 threads); the call after them probes with
     all its threads.  A late call that was not backed off doubles the
     period (first POSENC_POOL_BACKOFF_FIRST, at most
     POSENC_POOL_BACKOFF_MAX); POSENC_POOL_CLEAN_CALLS calls in a row with all
     their threads and no late worker halve it (below the first: none).
   None of this changes a result: every item runs once, on whichever
   thread, with the same code. */
#ifndef POSENC_POOL_H
#define POSENC_POOL_H

#include "posenc_config.h"

typedef void (*posenc_item_fn)(void* ctx, Py_ssize_t item, int slot);

/* The values posenc_pool_counts writes. */
#define POSENC_POOL_NCOUNTS 9

/* Every item on the caller's thread, in order. */
static inline void posenc_pool_serial(Py_ssize_t n, posenc_item_fn fn, void* ctx) {
    for (Py_ssize_t i = 0; i < n; i++) fn(ctx, i, 0);
}

#if defined(__GNUC__) && !defined(_WIN32)
#define POSENC_POOL 1
#include <pthread.h>
#include <sched.h>
#include <time.h>

/* Workers the pool starts at most: _threads.MAX_KERNEL_THREADS - 1 (started
   on first use, only as many as a call asks for). */
#define POSENC_POOL_MAX_WORKERS 32767
/* Polls of the in-flight counter between sched_yield() calls while the caller
   waits for the items workers are running. */
#define POSENC_POOL_SPINS 64
/* The back-off (above).  Chosen by simulating the policy against a fixed
   chance p that a call with all its threads is late (p = 0.1%, 0.3%, 1%, 3%,
   10%, 50%, 100%; 400000 calls): late calls stay at 0.09-0.12% of all calls
   for every p (a p99 needs < 1%), and at p = 0.1% (a quiet machine's
   hiccups) 3.3% of calls are backed off.  (First 16 with a halving after 128
   clean calls let 0.28% through at p = 0.3%; first 8, longest 512: 0.2%.)
   bench/report.py --contention measures it beside a busy process. */
#define POSENC_POOL_BACKOFF_FIRST 32
#define POSENC_POOL_BACKOFF_MAX 1024
#define POSENC_POOL_CLEAN_CALLS 256
/* Test hooks (posenc_pool_hold): a worker held back as if it had no core,
   after it joins a call or after it claims its first item. */
#define POSENC_POOL_HOLD_BEFORE_ITEMS 1
#define POSENC_POOL_HOLD_ON_ITEM 2

#define POSENC_POOL_GEN(word) ((word) >> 32)
#define POSENC_POOL_COUNT(word) ((word) & 0xffffffffu)

/* The back-off's state and counts; read and written only by the call that
   owns the pool (`busy`). */
typedef struct {
    int period;                        /* calls a late call backs off; 0 = none yet */
    int left;                          /* calls still backed off */
    int cap;                           /* their thread count */
    int clean;                         /* calls in a row with all threads, none late */
    int64_t calls, capped, late;       /* calls that asked for threads; backed off; late */
} posenc_pool_policy;

static struct {
    /* (generation << 32) | items left unclaimed, and | admissions left. */
    uint64_t claim, admit;
    int64_t done;                      /* items finished in this generation */
    int busy;                          /* a call owns the pool */
    int caller_cpu;                    /* the CPU its caller published it on, or -1 */
    /* The call; written by its caller before the generation is published. */
    posenc_item_fn fn;
    void* ctx;
    uint32_t n;                        /* items */
    uint32_t generation;               /* last published */
    int sleepers;                      /* workers asleep or about to sleep (futex) */
    int started;                       /* workers running; the caller's */
    posenc_pool_policy policy;
    /* Test hooks. */
    int hold;                          /* POSENC_POOL_HOLD_... or 0 */
    int held;                          /* workers held now, under lock */
    int caller_waiting;                /* the caller waits for workers: 1, 2 once late */
    int64_t worker_items;              /* items run by workers, ever (counted by the caller) */
    int64_t stood_down;                /* workers that stood down, ever */
    pthread_mutex_t lock;              /* the wake-up without futex, and the test hooks */
    pthread_cond_t wake;
    pthread_cond_t held_changed;
} posenc_pool = {.lock = PTHREAD_MUTEX_INITIALIZER, .wake = PTHREAD_COND_INITIALIZER,
                 .held_changed = PTHREAD_COND_INITIALIZER};

/* The CPU the calling thread runs on, or -1 where that is not known. */
static inline int posenc_pool_cpu(void) {
#if defined(__linux__)
    return sched_getcpu();
#else
    return -1;
#endif
}

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

/* Test hook: a worker that has no core, until posenc_pool_hold(0). */
static void posenc_pool_stall(void) {
    pthread_mutex_lock(&posenc_pool.lock);
    posenc_pool.held++;
    pthread_cond_broadcast(&posenc_pool.held_changed);
    while (posenc_pool.hold) pthread_cond_wait(&posenc_pool.held_changed, &posenc_pool.lock);
    posenc_pool.held--;
    pthread_cond_broadcast(&posenc_pool.held_changed);
    pthread_mutex_unlock(&posenc_pool.lock);
}

/* A worker's part in generation `gen`: an admission (its slot), then items
   until none is left.  fn and ctx are read only after an item of `gen` is
   claimed: until that item is done the caller cannot begin the next call. */
static void posenc_pool_join(uint32_t gen) {
    uint32_t left, slot = posenc_pool_take(&posenc_pool.admit, gen);
    int cpu, hold = __atomic_load_n(&posenc_pool.hold, __ATOMIC_ACQUIRE);
    if (slot == 0) return;
    cpu = posenc_pool_cpu();
    if (hold == 0 && cpu >= 0 && cpu == __atomic_load_n(&posenc_pool.caller_cpu, __ATOMIC_RELAXED)) {
        /* On its caller's CPU a worker could only run instead of the caller. */
        __atomic_fetch_add(&posenc_pool.stood_down, 1, __ATOMIC_RELAXED);
        return;
    }
    if (hold == POSENC_POOL_HOLD_BEFORE_ITEMS) posenc_pool_stall();
    while ((left = posenc_pool_take(&posenc_pool.claim, gen)) > 0) {
        if (hold == POSENC_POOL_HOLD_ON_ITEM) posenc_pool_stall();
        hold = 0;
        posenc_pool.fn(posenc_pool.ctx, (Py_ssize_t)(posenc_pool.n - left), (int)slot);
        __atomic_fetch_add(&posenc_pool.done, 1, __ATOMIC_RELEASE);
    }
}

/* Workers sleep until the generation moves on.  On Linux a futex on the
   generation word: publishing a call is a store and, only if a worker
   sleeps, a FUTEX_WAKE, so the caller never blocks.  (glibc's
   pthread_cond_broadcast may wait, when it switches groups, for waiters an
   earlier broadcast woke to get a core and leave.)  Elsewhere a condition
   variable. */
#if defined(__linux__)
#include <limits.h>
#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

static void posenc_pool_sleep(uint32_t seen) {
    __atomic_fetch_add(&posenc_pool.sleepers, 1, __ATOMIC_SEQ_CST);
    while (__atomic_load_n(&posenc_pool.generation, __ATOMIC_SEQ_CST) == seen)
        syscall(SYS_futex, &posenc_pool.generation, FUTEX_WAIT_PRIVATE, seen, NULL, NULL, 0);
    __atomic_fetch_sub(&posenc_pool.sleepers, 1, __ATOMIC_SEQ_CST);
}

static void posenc_pool_publish(uint32_t gen) {
    __atomic_store_n(&posenc_pool.generation, gen, __ATOMIC_SEQ_CST);
    if (__atomic_load_n(&posenc_pool.sleepers, __ATOMIC_SEQ_CST) > 0)
        syscall(SYS_futex, &posenc_pool.generation, FUTEX_WAKE_PRIVATE, INT_MAX, NULL, NULL, 0);
}
#else
static void posenc_pool_sleep(uint32_t seen) {
    pthread_mutex_lock(&posenc_pool.lock);
    while (__atomic_load_n(&posenc_pool.generation, __ATOMIC_ACQUIRE) == seen)
        pthread_cond_wait(&posenc_pool.wake, &posenc_pool.lock);
    pthread_mutex_unlock(&posenc_pool.lock);
}

static void posenc_pool_publish(uint32_t gen) {
    pthread_mutex_lock(&posenc_pool.lock);
    __atomic_store_n(&posenc_pool.generation, gen, __ATOMIC_RELEASE);
    pthread_cond_broadcast(&posenc_pool.wake);
    pthread_mutex_unlock(&posenc_pool.lock);
}
#endif

static void* posenc_pool_worker(void* unused) {
    uint32_t seen = __atomic_load_n(&posenc_pool.generation, __ATOMIC_ACQUIRE);
    (void)unused;
#if defined(__linux__)
    struct sched_param batch = {0};
    sched_setscheduler(0, SCHED_BATCH, &batch);  /* never preempt on wake-up (above) */
#endif
    for (;;) {
        posenc_pool_sleep(seen);
        seen = __atomic_load_n(&posenc_pool.generation, __ATOMIC_ACQUIRE);
        posenc_pool_join(seen);
    }
    return NULL;
}

/* After fork() the child has no workers and may have inherited a held lock. */
static void posenc_pool_after_fork(void) {
    pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
    pthread_cond_t cond = PTHREAD_COND_INITIALIZER;
    posenc_pool.lock = lock;
    posenc_pool.wake = cond;
    posenc_pool.held_changed = cond;
    posenc_pool.started = 0;
    posenc_pool.sleepers = 0;
    posenc_pool.busy = 0;
    posenc_pool.hold = 0;
    posenc_pool.held = 0;
    posenc_pool.caller_waiting = 0;
}

/* Starts workers up to `wanted`; returns how many run. */
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

/* The back-off: the threads a call that asks for `threads` runs on. */
static int posenc_pool_threads(posenc_pool_policy* policy, int threads) {
    policy->calls++;
    if (policy->left == 0) return threads;
    policy->left--;
    if (threads <= policy->cap) return threads;
    policy->capped++;
    return policy->cap;
}

/* The back-off after a call on `threads` threads (`capped`: backed off) in
   which `late` workers were late. */
static void posenc_pool_after(posenc_pool_policy* policy, int threads, int capped, int late) {
    if (late > 0) {
        policy->late++;
        if (!capped)
            policy->period = policy->period == 0 ? POSENC_POOL_BACKOFF_FIRST
                             : policy->period < POSENC_POOL_BACKOFF_MAX / 2 ? 2 * policy->period
                             : POSENC_POOL_BACKOFF_MAX;
        policy->cap = threads - late;
        policy->left = policy->period;
        policy->clean = 0;
    } else if (!capped && policy->period > 0 && ++policy->clean >= POSENC_POOL_CLEAN_CALLS) {
        policy->period = policy->period / 2 < POSENC_POOL_BACKOFF_FIRST ? 0 : policy->period / 2;
        policy->clean = 0;
    }
}

static inline int64_t posenc_pool_now_ns(void) {
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return (int64_t)now.tv_sec * 1000000000 + now.tv_nsec;
}

static void posenc_parallel_for(Py_ssize_t n, int threads, posenc_item_fn fn, void* ctx) {
    uint32_t left;
    uint64_t gen;
    int asked, workers, late = 0, spins = 0;
    int64_t started_ns, waiting_since_ns, own = 0;
    if (threads > n) threads = (int)n;
    if (threads > POSENC_POOL_MAX_WORKERS + 1) threads = POSENC_POOL_MAX_WORKERS + 1;
    if (threads < 2 || n > 0xffffffffLL || __atomic_exchange_n(&posenc_pool.busy, 1, __ATOMIC_ACQUIRE)) {
        posenc_pool_serial(n, fn, ctx);
        return;
    }
    asked = threads;
    threads = posenc_pool_threads(&posenc_pool.policy, threads);
    if (threads < 2) {
        posenc_pool_serial(n, fn, ctx);
        __atomic_store_n(&posenc_pool.busy, 0, __ATOMIC_RELEASE);
        return;
    }
    workers = posenc_pool_start(threads - 1);
    if (workers > threads - 1) workers = threads - 1;
    gen = (uint64_t)(uint32_t)(__atomic_load_n(&posenc_pool.generation, __ATOMIC_RELAXED) + 1);
    posenc_pool.fn = fn;
    posenc_pool.ctx = ctx;
    posenc_pool.n = (uint32_t)n;
    posenc_pool.caller_cpu = posenc_pool_cpu();
    __atomic_store_n(&posenc_pool.done, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&posenc_pool.admit, gen << 32 | (uint64_t)workers, __ATOMIC_RELEASE);
    __atomic_store_n(&posenc_pool.claim, gen << 32 | (uint64_t)n, __ATOMIC_RELEASE);
    posenc_pool_publish((uint32_t)gen);
    if (__atomic_load_n(&posenc_pool.hold, __ATOMIC_ACQUIRE) == POSENC_POOL_HOLD_ON_ITEM) {
        /* test hook: every worker holds an item before the caller starts */
        pthread_mutex_lock(&posenc_pool.lock);
        while (posenc_pool.held < workers) pthread_cond_wait(&posenc_pool.held_changed, &posenc_pool.lock);
        pthread_mutex_unlock(&posenc_pool.lock);
    }
    started_ns = posenc_pool_now_ns();
    while ((left = posenc_pool_take(&posenc_pool.claim, (uint32_t)gen)) > 0) {
        fn(ctx, n - (Py_ssize_t)left, 0);
        own++;
        __atomic_fetch_add(&posenc_pool.done, 1, __ATOMIC_RELEASE);
    }
    /* Every item is claimed: wait for those workers are running (each runs
       one at most); the ones still running when the wait has lasted longer
       than the caller's own work are late. */
    waiting_since_ns = posenc_pool_now_ns();
    __atomic_store_n(&posenc_pool.caller_waiting, 1, __ATOMIC_RELEASE);
    while (__atomic_load_n(&posenc_pool.done, __ATOMIC_ACQUIRE) < (int64_t)n) {
        if (++spins % POSENC_POOL_SPINS != 0) continue;
        sched_yield();
        if (late == 0 && posenc_pool_now_ns() - waiting_since_ns > waiting_since_ns - started_ns) {
            late = (int)((int64_t)n - __atomic_load_n(&posenc_pool.done, __ATOMIC_ACQUIRE));
            if (late > 0) __atomic_store_n(&posenc_pool.caller_waiting, 2, __ATOMIC_RELEASE);
        }
    }
    __atomic_store_n(&posenc_pool.caller_waiting, 0, __ATOMIC_RELEASE);
    __atomic_store_n(&posenc_pool.worker_items, posenc_pool.worker_items + (int64_t)n - own,
                     __ATOMIC_RELAXED);  /* only the pool's owner writes it */
    posenc_pool_after(&posenc_pool.policy, threads, threads < asked, late);
    __atomic_store_n(&posenc_pool.busy, 0, __ATOMIC_RELEASE);
}

/* Test hooks: hold workers back (POSENC_POOL_HOLD_..., 0 releases them).
   Releasing returns once every held worker has left its stall, so that a
   worker without a core is never counted as held by the next call. */
static void posenc_pool_hold(int hold) {
    pthread_mutex_lock(&posenc_pool.lock);
    __atomic_store_n(&posenc_pool.hold, hold, __ATOMIC_RELEASE);
    if (!hold) {
        pthread_cond_broadcast(&posenc_pool.held_changed);
        while (posenc_pool.held > 0) pthread_cond_wait(&posenc_pool.held_changed, &posenc_pool.lock);
    }
    pthread_mutex_unlock(&posenc_pool.lock);
}

/* The back-off's state and counts, the items workers ran, and whether a
   caller waits for workers now, and the workers that stood down:
   POSENC_POOL_NCOUNTS values into `counts`. */
static void posenc_pool_counts(int64_t* counts) {
    const posenc_pool_policy* policy = &posenc_pool.policy;
    counts[0] = policy->calls;
    counts[1] = policy->capped;
    counts[2] = policy->late;
    counts[3] = policy->period;
    counts[4] = policy->left;
    counts[5] = policy->cap;
    counts[6] = __atomic_load_n(&posenc_pool.worker_items, __ATOMIC_RELAXED);
    counts[7] = __atomic_load_n(&posenc_pool.caller_waiting, __ATOMIC_ACQUIRE);
    counts[8] = __atomic_load_n(&posenc_pool.stood_down, __ATOMIC_RELAXED);
}

/* Test hook: forget the back-off (no call may run meanwhile). */
static void posenc_pool_reset_backoff(void) {
    posenc_pool_policy none = {0};
    posenc_pool.policy = none;
}

#else  /* no pool: every call on its caller's thread */
#define POSENC_POOL 0
static void posenc_parallel_for(Py_ssize_t n, int threads, posenc_item_fn fn, void* ctx) {
    (void)threads;
    posenc_pool_serial(n, fn, ctx);
}
static void posenc_pool_hold(int hold) { (void)hold; }
static void posenc_pool_counts(int64_t* counts) {
    for (int i = 0; i < POSENC_POOL_NCOUNTS; i++) counts[i] = 0;
}
static void posenc_pool_reset_backoff(void) {}
#endif

#endif
