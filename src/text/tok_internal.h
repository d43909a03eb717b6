// Internals of the tokenizer shared by its loader (tokenizer.c), the encoder (tok_encode.c),
// the BPE merge step (tok_bpe.c) and the word cache (tok_cache.c). Not for other modules.
#pragma once
#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "text/tokenizer.h"

uint64_t tok_hash(const void *p, size_t n);

// Pair of token ids -> (merge rank, merged id), open addressing.
struct merge_map {
    uint64_t *keys; // (left << 32) | right; UINT64_MAX marks an empty slot
    uint64_t *vals; // (rank << 32) | merged id
    size_t mask;
};
static inline bool merge_get(const struct merge_map *m, int32_t a, int32_t b, uint32_t *rank,
                             int32_t *id) {
    uint64_t k = ((uint64_t)(uint32_t)a << 32) | (uint32_t)b;
    size_t i = (size_t)((k * 0x9E3779B97F4A7C15ull) >> 20) & m->mask;
    for (;; i = (i + 1) & m->mask) {
        if (m->keys[i] == k) {
            *rank = (uint32_t)(m->vals[i] >> 32);
            *id = (int32_t)(uint32_t)m->vals[i];
            return true;
        }
        if (m->keys[i] == UINT64_MAX) return false;
    }
}

// An added token: matched in the text before the normalizer / pre-tokenizer run.
struct added_token {
    int32_t id;
    const char *content; // points into the tokenizer's string arena
    size_t len;
    bool special, lstrip, rstrip, single_word, normalized;
};

// Cache of pre-token bytes -> ids, shared by all encode calls: a call uses it only between
// word_cache_acquire() (which fails, without waiting, while another thread holds it) and
// word_cache_release().
struct word_cache {
    pthread_mutex_t mu;
    uint32_t *slots; // entry index + 1; 0 = empty
    size_t mask;
    struct cache_entry {
        uint64_t hash;
        uint32_t key_off, ids_off;
        uint16_t key_len, n_ids;
    } * entries;
    size_t n_entries, max_entries;
    char *keys;
    size_t keys_used, keys_cap;
    int32_t *ids;
    size_t ids_used, ids_cap;
};
#define WORD_CACHE_MAX_KEY 96

struct tokenizer {
    int n_ids;        // 1 + largest id (vocabulary and added tokens)
    char *bytes;      // token bytes, all ids back to back
    uint32_t *off;    // bytes of id i: bytes + off[i], length len[i]
    uint32_t *len;    // UINT32_MAX: id not defined
    uint8_t *special; // per id
    size_t max_len;   // longest token, in bytes

    uint64_t *vocab_slots; // BPE vocabulary by raw bytes: hash tag and id + 1, 0 = empty
    size_t vocab_mask;
    int32_t byte_id[256]; // id of each single byte (-1 if the vocabulary lacks it)

    struct merge_map merges;
    bool ignore_merges; // a whole word found in the vocabulary is one token

    struct added_token *added;
    int n_added;
    char *added_arena;
    bool added_first[2][256]; // [normalized] first bytes of added tokens, for fast scanning
    int n_added_kind[2];

    bool nfc;
    pcre2_code *split_re; // NULL: no Split pre-tokenizer (whole text is one piece)

    struct word_cache *cache;
};

// Id of a BPE vocabulary token given its raw bytes, or -1.
int32_t tok_vocab_find(const struct tokenizer *t, const char *s, size_t n);

// Byte-pair merges of one pre-token (raw bytes) -> ids appended to out (capacity >= n).
// scratch must hold 9 * n + 16 uint32 words. Returns the number of ids.
size_t tok_bpe(const struct tokenizer *t, const unsigned char *w, size_t n, int32_t *out,
               uint32_t *scratch);

struct word_cache *word_cache_new(void);
bool word_cache_acquire(struct word_cache *c);
void word_cache_release(struct word_cache *c);
void word_cache_free(struct word_cache *c);
// Looks up key; on a hit copies the ids to out (capacity >= WORD_CACHE_MAX_KEY) and returns
// their count, else -1.
int word_cache_get(struct word_cache *c, const char *key, size_t n, uint64_t h, int32_t *out);
void word_cache_put(struct word_cache *c, const char *key, size_t n, uint64_t h, const int32_t *ids,
                    int n_ids);

struct jv;
// Reads normalizer, pre_tokenizer and decoder of a tokenizer.json (tok_pipeline.c).
int tok_load_pipeline(struct tokenizer *t, const struct jv *root, struct wren_err *e);

// Translates a regex written for Oniguruma / Rust (what the tokenizers library runs) into the
// PCRE2 dialect with the same meaning where the two differ (\s, \w classes) and compiles it
// with UTF + UCP. Returns NULL and fills e on a bad pattern.
pcre2_code *tok_regex_compile(const char *pattern, size_t len, bool literal, struct wren_err *e);
