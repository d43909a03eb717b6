#include "backend/cpu/threadpool.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <unistd.h>

#include "util/util.h"

struct threadpool {
    int n; // threads including the caller
    pthread_t *threads;
    pthread_mutex_t mu;
    pthread_cond_t start, done;
    unsigned long generation; // bumped for each loop
    int running;              // workers still busy with the current loop
    int quit;
    // the current loop
    parallel_fn fn;
    void *ctx;
    int total, block;
    atomic_int next;
};

static void run_blocks(struct threadpool *tp) {
    for (;;) {
        int b = atomic_fetch_add(&tp->next, 1);
        int begin = b * tp->block;
        if (begin >= tp->total) break;
        int end = begin + tp->block < tp->total ? begin + tp->block : tp->total;
        tp->fn(tp->ctx, begin, end);
    }
}

static void *worker(void *arg) {
    struct threadpool *tp = arg;
    unsigned long seen = 0;
    pthread_mutex_lock(&tp->mu);
    for (;;) {
        while (tp->generation == seen && !tp->quit) pthread_cond_wait(&tp->start, &tp->mu);
        if (tp->quit) break;
        seen = tp->generation;
        pthread_mutex_unlock(&tp->mu);
        run_blocks(tp);
        pthread_mutex_lock(&tp->mu);
        if (--tp->running == 0) pthread_cond_signal(&tp->done);
    }
    pthread_mutex_unlock(&tp->mu);
    return NULL;
}

struct threadpool *threadpool_new(int n_threads) {
    if (n_threads <= 0) n_threads = (int)sysconf(_SC_NPROCESSORS_ONLN);
    if (n_threads < 1) n_threads = 1;
    struct threadpool *tp = xcalloc(1, sizeof *tp);
    tp->n = n_threads;
    pthread_mutex_init(&tp->mu, NULL);
    pthread_cond_init(&tp->start, NULL);
    pthread_cond_init(&tp->done, NULL);
    tp->threads = xcalloc((size_t)n_threads, sizeof *tp->threads);
    for (int i = 1; i < n_threads; i++)
        if (pthread_create(&tp->threads[i], NULL, worker, tp)) {
            tp->n = i; // run with the threads we got
            break;
        }
    return tp;
}

void threadpool_free(struct threadpool *tp) {
    if (!tp) return;
    pthread_mutex_lock(&tp->mu);
    tp->quit = 1;
    pthread_cond_broadcast(&tp->start);
    pthread_mutex_unlock(&tp->mu);
    for (int i = 1; i < tp->n; i++) pthread_join(tp->threads[i], NULL);
    pthread_mutex_destroy(&tp->mu);
    pthread_cond_destroy(&tp->start);
    pthread_cond_destroy(&tp->done);
    free(tp->threads);
    free(tp);
}

int threadpool_size(const struct threadpool *tp) {
    return tp->n;
}

void parallel_for(struct threadpool *tp, int n, int grain, parallel_fn fn, void *ctx) {
    if (n <= 0) return;
    if (grain < 1) grain = 1;
    int blocks = tp->n * 4;
    int block = (n + blocks - 1) / blocks;
    if (block < grain) block = grain;
    if (tp->n == 1 || block >= n) {
        fn(ctx, 0, n);
        return;
    }
    pthread_mutex_lock(&tp->mu);
    tp->fn = fn, tp->ctx = ctx, tp->total = n, tp->block = block;
    atomic_store(&tp->next, 0);
    tp->running = tp->n - 1;
    tp->generation++;
    pthread_cond_broadcast(&tp->start);
    pthread_mutex_unlock(&tp->mu);
    run_blocks(tp);
    pthread_mutex_lock(&tp->mu);
    while (tp->running > 0) pthread_cond_wait(&tp->done, &tp->mu);
    pthread_mutex_unlock(&tp->mu);
}
