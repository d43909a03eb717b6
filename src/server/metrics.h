// Counters for GET /metrics (Prometheus text format). Updated by the HTTP threads and the worker.
#pragma once
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

struct metrics {
    pthread_mutex_t mu;
    uint64_t requests[6]; // by outcome: see metrics_request()
    uint64_t prompt_tokens, cached_tokens, prefill_tokens, completion_tokens;
    uint64_t cache_hits, cache_misses;
    double prefill_sec, decode_sec;
    double last_prefill_tps, last_decode_tps;
    size_t cache_bytes;
    int cache_entries;
    int busy;
};

enum metrics_outcome {
    OUT_OK,
    OUT_CLIENT_ERROR,
    OUT_REJECTED,
    OUT_CANCELLED,
    OUT_SERVER_ERROR,
    OUT_N
};

void metrics_init(struct metrics *m);
void metrics_request(struct metrics *m, enum metrics_outcome o);
// One finished generation: tokens fed (prefill) and generated, with their times.
void metrics_generation(struct metrics *m, int n_prompt, int n_cached, int n_prefill,
                        double prefill_sec, int n_gen, double decode_sec);
void metrics_cache(struct metrics *m, int hit, size_t bytes, int entries);
void metrics_busy(struct metrics *m, int busy);
// Renders the Prometheus text (malloc'd).
char *metrics_text(struct metrics *m, int queue_depth);
