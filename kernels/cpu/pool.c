/* pool.c — a spinning thread pool. Decode steps of a small model take microseconds,
   so workers spin on a generation counter for a while before they sleep; waking a
   sleeping worker through a condition variable would cost more than the work. */
#include <pthread.h>
#include <stdatomic.h>
#include <immintrin.h>

#include "backend.h"
#include "pool.h"

#define MAX_THREADS 64
#define SPIN_ROUNDS 2000

static struct {
    int n; /* threads including the caller */
    pthread_t tid[MAX_THREADS];
    atomic_int gen, done, quit;
    PoolFn fn;
    void *ctx;
    int items, align;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    atomic_int sleepers;
    atomic_flag busy; /* a call holds the workers */
} P = {.n = 1, .mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER, .busy = ATOMIC_FLAG_INIT};

static void chunk(int id, int nthreads, int *b, int *e) {
    int units = (P.items + P.align - 1) / P.align;
    int per = units / nthreads, extra = units % nthreads;
    int ub = id * per + (id < extra ? id : extra);
    int ue = ub + per + (id < extra);
    *b = ub * P.align;
    *e = ue * P.align < P.items ? ue * P.align : P.items;
}

static void *worker(void *arg) {
    int id = (int)(long)arg, seen = 0;
    for (;;) {
        int g, spins = 0;
        while ((g = atomic_load_explicit(&P.gen, memory_order_acquire)) == seen) {
            if (atomic_load(&P.quit)) return NULL;
            if (++spins < SPIN_ROUNDS) {
                _mm_pause();
                continue;
            }
            pthread_mutex_lock(&P.mu);
            atomic_fetch_add(&P.sleepers, 1);
            while (atomic_load(&P.gen) == seen && !atomic_load(&P.quit)) pthread_cond_wait(&P.cv, &P.mu);
            atomic_fetch_sub(&P.sleepers, 1);
            pthread_mutex_unlock(&P.mu);
            spins = 0;
        }
        seen = g;
        int b, e;
        chunk(id, P.n, &b, &e);
        if (b < e) P.fn(P.ctx, b, e);
        atomic_fetch_add_explicit(&P.done, 1, memory_order_release);
    }
}

static void pool_stop(void) {
    atomic_store(&P.quit, 1);
    pthread_mutex_lock(&P.mu);
    pthread_cond_broadcast(&P.cv);
    pthread_mutex_unlock(&P.mu);
    for (int i = 1; i < P.n; i++) pthread_join(P.tid[i], NULL);
    /* new workers start at seen = 0: a stale count would run the last call again */
    atomic_store(&P.gen, 0);
    atomic_store(&P.quit, 0);
    P.n = 1;
}

int k_init(int n_threads) {
    if (n_threads < 1) n_threads = 1;
    if (n_threads > MAX_THREADS) n_threads = MAX_THREADS;
    if (n_threads == P.n) return 0;
    pool_stop();
    P.n = n_threads;
    for (int i = 1; i < n_threads; i++)
        if (pthread_create(&P.tid[i], NULL, worker, (void *)(long)i)) {
            P.n = i;
            return -1;
        }
    return 0;
}

int k_threads(void) { return P.n; }

void pool_run(PoolFn fn, void *ctx, int n, int align, int min_per_thread) {
    /* a second caller thread (two runners at once) runs its call alone: every split
       gives the same bits, so it need not wait for the workers */
    if (P.n == 1 || n < 2 * min_per_thread || atomic_flag_test_and_set_explicit(&P.busy, memory_order_acquire)) {
        fn(ctx, 0, n);
        return;
    }
    P.fn = fn;
    P.ctx = ctx;
    P.items = n;
    P.align = align;
    atomic_store(&P.done, 0);
    atomic_fetch_add(&P.gen, 1); /* seq_cst: pairs with the sleepers count */
    if (atomic_load(&P.sleepers)) {
        pthread_mutex_lock(&P.mu);
        pthread_cond_broadcast(&P.cv);
        pthread_mutex_unlock(&P.mu);
    }
    int b, e;
    chunk(0, P.n, &b, &e);
    if (b < e) fn(ctx, b, e);
    while (atomic_load_explicit(&P.done, memory_order_acquire) < P.n - 1) _mm_pause();
    atomic_flag_clear_explicit(&P.busy, memory_order_release);
}

const char *k_backends(void) {
#ifdef PD_CUDA
    return "cpu cuemu cuda";
#else
    return "cpu cuemu";
#endif
}

const char *k_cpu_features(void) {
    return ""
#ifdef __AVX512F__
           "avx512f "
#endif
#ifdef __AVX512BW__
           "avx512bw "
#endif
#ifdef __AVX512VNNI__
           "avx512vnni "
#endif
#ifdef __AVXVNNI__
           "avxvnni "
#endif
#ifdef __AVX512BF16__
           "avx512bf16 "
#endif
#ifdef __AVX2__
           "avx2 "
#endif
#ifdef __FMA__
           "fma "
#endif
           "(scalar paths always)";
}
