// A fixed pool of worker threads running one parallel loop at a time (the calling thread works
// too). Cheap enough to call per matmul.
#pragma once

struct threadpool;

// fn(ctx, begin, end) is called on disjoint index ranges covering [0, n).
typedef void (*parallel_fn)(void *ctx, int begin, int end);

struct threadpool *threadpool_new(int n_threads); // n_threads <= 0: online CPUs
void threadpool_free(struct threadpool *tp);
int threadpool_size(const struct threadpool *tp);
// Splits [0, n) into contiguous blocks of at least `grain` indices, one or more per thread.
void parallel_for(struct threadpool *tp, int n, int grain, parallel_fn fn, void *ctx);
