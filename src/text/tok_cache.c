// Word cache: prose repeats its words, so most pre-tokens are found here instead of being merged
// again. An encode call holds the cache for its whole duration (one lock per call, not per word);
// a call that finds it busy in another thread simply encodes without it. Fixed-size tables; when
// one fills up the whole cache starts over (cheap, and keeps memory bounded whatever the input).
#include <stdlib.h>
#include <string.h>

#include "text/tok_internal.h"
#include "util/util.h"

#define CACHE_SLOTS   (1u << 17)
#define CACHE_ENTRIES (CACHE_SLOTS / 2)

struct word_cache *word_cache_new(void) {
    struct word_cache *c = xcalloc(1, sizeof *c);
    pthread_mutex_init(&c->mu, NULL);
    c->slots = xcalloc(CACHE_SLOTS, sizeof *c->slots);
    c->mask = CACHE_SLOTS - 1;
    c->max_entries = CACHE_ENTRIES;
    c->entries = xmalloc(CACHE_ENTRIES * sizeof *c->entries);
    c->keys_cap = (size_t)CACHE_ENTRIES * 16;
    c->keys = xmalloc(c->keys_cap);
    c->ids_cap = (size_t)CACHE_ENTRIES * 4;
    c->ids = xmalloc(c->ids_cap * sizeof *c->ids);
    return c;
}

void word_cache_free(struct word_cache *c) {
    if (!c) return;
    pthread_mutex_destroy(&c->mu);
    free(c->slots);
    free(c->entries);
    free(c->keys);
    free(c->ids);
    free(c);
}

static const struct cache_entry *find(const struct word_cache *c, const char *key, size_t n,
                                      uint64_t h, size_t *slot) {
    size_t i = (size_t)h & c->mask;
    for (;; i = (i + 1) & c->mask) {
        uint32_t v = c->slots[i];
        if (!v) break;
        const struct cache_entry *en = &c->entries[v - 1];
        if (en->hash == h && en->key_len == n && !memcmp(c->keys + en->key_off, key, n)) return en;
    }
    *slot = i;
    return NULL;
}

bool word_cache_acquire(struct word_cache *c) {
    return pthread_mutex_trylock(&c->mu) == 0;
}

void word_cache_release(struct word_cache *c) {
    pthread_mutex_unlock(&c->mu);
}

int word_cache_get(struct word_cache *c, const char *key, size_t n, uint64_t h, int32_t *out) {
    size_t slot;
    const struct cache_entry *en = find(c, key, n, h, &slot);
    int k = -1;
    if (en) {
        k = en->n_ids;
        memcpy(out, c->ids + en->ids_off, (size_t)k * sizeof *out);
    }
    return k;
}

void word_cache_put(struct word_cache *c, const char *key, size_t n, uint64_t h, const int32_t *ids,
                    int n_ids) {
    if (n > WORD_CACHE_MAX_KEY || n_ids > WORD_CACHE_MAX_KEY) return;
    if (c->n_entries >= c->max_entries || c->keys_used + n > c->keys_cap ||
        c->ids_used + (size_t)n_ids > c->ids_cap) {
        memset(c->slots, 0, (c->mask + 1) * sizeof *c->slots);
        c->n_entries = c->keys_used = c->ids_used = 0;
    }
    size_t slot;
    if (!find(c, key, n, h, &slot)) {
        struct cache_entry *en = &c->entries[c->n_entries];
        *en = (struct cache_entry){.hash = h,
                                   .key_off = (uint32_t)c->keys_used,
                                   .ids_off = (uint32_t)c->ids_used,
                                   .key_len = (uint16_t)n,
                                   .n_ids = (uint16_t)n_ids};
        memcpy(c->keys + c->keys_used, key, n);
        memcpy(c->ids + c->ids_used, ids, (size_t)n_ids * sizeof *ids);
        c->keys_used += n;
        c->ids_used += (size_t)n_ids;
        c->slots[slot] = (uint32_t)++c->n_entries;
    }
}
