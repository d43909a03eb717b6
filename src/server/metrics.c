#include <stdio.h>
#include <stdlib.h>

#include "server/metrics.h"
#include "util/util.h"

static const char *const OUTCOME[OUT_N] = {"ok", "client_error", "rejected", "cancelled",
                                           "server_error"};

void metrics_init(struct metrics *m) {
    *m = (struct metrics){0};
    pthread_mutex_init(&m->mu, NULL);
}

void metrics_request(struct metrics *m, enum metrics_outcome o) {
    pthread_mutex_lock(&m->mu);
    m->requests[o]++;
    pthread_mutex_unlock(&m->mu);
}

void metrics_generation(struct metrics *m, int n_prompt, int n_cached, int n_prefill,
                        double prefill_sec, int n_gen, double decode_sec) {
    pthread_mutex_lock(&m->mu);
    m->prompt_tokens += (uint64_t)n_prompt;
    m->cached_tokens += (uint64_t)n_cached;
    m->prefill_tokens += (uint64_t)n_prefill;
    m->completion_tokens += (uint64_t)n_gen;
    m->prefill_sec += prefill_sec;
    m->decode_sec += decode_sec;
    if (n_prefill > 0 && prefill_sec > 0) m->last_prefill_tps = n_prefill / prefill_sec;
    if (n_gen > 1 && decode_sec > 0) m->last_decode_tps = n_gen / decode_sec;
    pthread_mutex_unlock(&m->mu);
}

void metrics_cache(struct metrics *m, int hit, size_t bytes, int entries) {
    pthread_mutex_lock(&m->mu);
    if (hit > 0)
        m->cache_hits++;
    else if (hit == 0)
        m->cache_misses++;
    m->cache_bytes = bytes;
    m->cache_entries = entries;
    pthread_mutex_unlock(&m->mu);
}

void metrics_busy(struct metrics *m, int busy) {
    pthread_mutex_lock(&m->mu);
    m->busy = busy;
    pthread_mutex_unlock(&m->mu);
}

char *metrics_text(struct metrics *m, int queue_depth) {
    size_t cap = 4096, n = 0;
    char *s = xmalloc(cap);
#define P(...) n += (size_t)snprintf(s + n, cap - n, __VA_ARGS__)
    pthread_mutex_lock(&m->mu);
    P("# HELP wren_requests_total Chat completion requests by outcome.\n"
      "# TYPE wren_requests_total counter\n");
    for (int i = 0; i < OUT_N; i++)
        P("wren_requests_total{outcome=\"%s\"} %llu\n", OUTCOME[i],
          (unsigned long long)m->requests[i]);
    P("# TYPE wren_prompt_tokens_total counter\nwren_prompt_tokens_total %llu\n",
      (unsigned long long)m->prompt_tokens);
    P("# HELP wren_cached_prompt_tokens_total Prompt tokens resumed from saved state.\n"
      "# TYPE wren_cached_prompt_tokens_total counter\nwren_cached_prompt_tokens_total %llu\n",
      (unsigned long long)m->cached_tokens);
    P("# HELP wren_prefill_tokens_total Prompt tokens run through the model.\n"
      "# TYPE wren_prefill_tokens_total counter\nwren_prefill_tokens_total %llu\n",
      (unsigned long long)m->prefill_tokens);
    P("# TYPE wren_completion_tokens_total counter\nwren_completion_tokens_total %llu\n",
      (unsigned long long)m->completion_tokens);
    P("# TYPE wren_prefill_seconds_total counter\nwren_prefill_seconds_total %.6f\n",
      m->prefill_sec);
    P("# TYPE wren_decode_seconds_total counter\nwren_decode_seconds_total %.6f\n", m->decode_sec);
    P("# HELP wren_prefill_tokens_per_second Prefill speed of the last request.\n"
      "# TYPE wren_prefill_tokens_per_second gauge\nwren_prefill_tokens_per_second %.3f\n",
      m->last_prefill_tps);
    P("# HELP wren_decode_tokens_per_second Decode speed of the last request.\n"
      "# TYPE wren_decode_tokens_per_second gauge\nwren_decode_tokens_per_second %.3f\n",
      m->last_decode_tps);
    P("# TYPE wren_queue_depth gauge\nwren_queue_depth %d\n", queue_depth);
    P("# TYPE wren_busy gauge\nwren_busy %d\n", m->busy);
    P("# TYPE wren_cache_hits_total counter\nwren_cache_hits_total %llu\n",
      (unsigned long long)m->cache_hits);
    P("# TYPE wren_cache_misses_total counter\nwren_cache_misses_total %llu\n",
      (unsigned long long)m->cache_misses);
    P("# TYPE wren_cache_bytes gauge\nwren_cache_bytes %zu\n", m->cache_bytes);
    P("# TYPE wren_cache_entries gauge\nwren_cache_entries %d\n", m->cache_entries);
    pthread_mutex_unlock(&m->mu);
#undef P
    return s;
}
