// Loading a Hugging Face tokenizer.json of the byte-level BPE kind (Qwen2/3/3.5) into flat
// tables: token bytes by id, a hash of the vocabulary by raw bytes, a hash of merges by id pair.
// Everything the file says that this tokenizer cannot honour is an error, never ignored.
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "text/bytelevel.h"
#include "text/tok_internal.h"
#include "text/tok_json.h"
#include "text/utf8.h"
#include "util/util.h"

#define MAX_IDS (1 << 24)

static inline uint64_t load64(const unsigned char *s) {
    uint64_t v;
    memcpy(&v, s, 8);
    return v;
}

static inline uint64_t load32(const unsigned char *s) {
    uint32_t v;
    memcpy(&v, s, 4);
    return v;
}

// Short keys (most words and tokens) are read with at most two overlapping loads, never past
// the end; one multiply-xorshift round per 8 bytes, a murmur3 finalizer so the low bits used as
// table indices depend on every input bit.
uint64_t tok_hash(const void *p, size_t n) {
    const unsigned char *s = p;
    uint64_t h = 0x243F6A8885A308D3ull ^ (n * 0x9E3779B97F4A7C15ull), v;
    if (n >= 8) {
        for (; n > 8; s += 8, n -= 8) {
            h = (h ^ load64(s)) * 0xFF51AFD7ED558CCDull;
            h ^= h >> 32;
        }
        v = load64(s + n - 8); // the last 8 bytes (overlapping the previous block)
    } else if (n >= 4) {
        v = load32(s) | load32(s + n - 4) << 32;
    } else if (n > 0) {
        v = (uint64_t)s[0] | (uint64_t)s[n / 2] << 8 | (uint64_t)s[n - 1] << 16;
    } else {
        v = 0;
    }
    h ^= v;
    h ^= h >> 33;
    h *= 0xFF51AFD7ED558CCDull;
    h ^= h >> 33;
    h *= 0xC4CEB9FE1A85EC53ull;
    h ^= h >> 33;
    return h;
}

static size_t pow2_at_least(size_t n) {
    size_t c = 16;
    while (c < n) c *= 2;
    return c;
}

// Slots hold (hash >> 32) << 32 | (id + 1): most probes are settled without touching the token
// bytes, which matters when building the merge table (three lookups per merge).
static int32_t vocab_find_h(const struct tokenizer *t, const char *s, size_t n, uint64_t h);

int32_t tok_vocab_find(const struct tokenizer *t, const char *s, size_t n) {
    return vocab_find_h(t, s, n, tok_hash(s, n));
}

static void vocab_insert(struct tokenizer *t, int32_t id, uint64_t h) {
    const char *s = t->bytes + t->off[id];
    size_t n = t->len[id];
    size_t i = (size_t)h & t->vocab_mask;
    for (; t->vocab_slots[i]; i = (i + 1) & t->vocab_mask) {
        // Two strings with the same bytes (possible only with characters outside the ByteLevel
        // alphabet): the first keeps the bytes, as a lookup can return only one.
        uint64_t v = t->vocab_slots[i];
        int32_t o = (int32_t)((uint32_t)v - 1);
        if ((v >> 32) == (h >> 32) && t->len[o] == n && !memcmp(t->bytes + t->off[o], s, n)) return;
    }
    t->vocab_slots[i] = (h >> 32 << 32) | ((uint64_t)id + 1);
}

static size_t merge_slot(const struct merge_map *m, uint64_t k) {
    return (size_t)((k * 0x9E3779B97F4A7C15ull) >> 20) & m->mask;
}

// Later duplicates replace earlier ones, as the tokenizers library's HashMap collect does.
static void merge_insert(struct merge_map *m, int32_t a, int32_t b, uint32_t rank, int32_t id) {
    uint64_t k = ((uint64_t)(uint32_t)a << 32) | (uint32_t)b;
    size_t i = merge_slot(m, k);
    for (; m->keys[i] != UINT64_MAX && m->keys[i] != k; i = (i + 1) & m->mask) {
    }
    m->keys[i] = k;
    m->vals[i] = ((uint64_t)rank << 32) | (uint32_t)id;
}

// Token text as stored: ByteLevel characters decoded to bytes when they all belong to the
// alphabet, the UTF-8 text itself otherwise (what the ByteLevel decoder does).
static size_t token_bytes_of(const char *s, size_t n, char *out) {
    long k = bytelevel_decode(s, n, out);
    if (k >= 0) return (size_t)k;
    memcpy(out, s, n);
    return n;
}

static int set_token(struct tokenizer *t, size_t *used, int32_t id, const char *s, size_t n) {
    size_t k = token_bytes_of(s, n, t->bytes + *used);
    t->off[id] = (uint32_t)*used;
    t->len[id] = (uint32_t)k;
    *used += k;
    if (k > t->max_len) t->max_len = k;
    return 0;
}

static int get_id(const struct jv *v, int32_t *out) {
    if (!jv_is(v, JV_NUMBER)) return -1;
    double d = v->num;
    if (!(d >= 0 && d < MAX_IDS) || d != (double)(int32_t)d) return -1;
    *out = (int32_t)d;
    return 0;
}

// Missing and empty-string options are equivalent in the tokenizers library.
static bool empty_or_null(const struct jv *o, const char *key) {
    const struct jv *v = jv_get(o, key);
    return !v || jv_is(v, JV_NULL) || (jv_is(v, JV_STRING) && !v->str[0]);
}

// A merge as "a b" or ["a", "b"]; sets the two halves (pointing into the JSON or into buf).
static int merge_parts(const struct jv *m, const char **a, size_t *na, const char **b, size_t *nb) {
    if (jv_is(m, JV_STRING)) {
        const char *s = m->str, *sp = strchr(s, ' ');
        if (!sp || strchr(sp + 1, ' ')) return -1;
        *a = s, *na = (size_t)(sp - s), *b = sp + 1, *nb = m->len - *na - 1;
        return 0;
    }
    if (jv_is(m, JV_ARRAY) && m->n == 2 && jv_is(m->child, JV_STRING) &&
        jv_is(m->child->next, JV_STRING)) {
        *a = m->child->str, *na = m->child->len;
        *b = m->child->next->str, *nb = m->child->next->len;
        return 0;
    }
    return -1;
}

// Merges are resolved in batches: hash every key of the batch and prefetch its slot first, then
// look them up. The tables are far bigger than the caches, so this hides most of the memory
// latency that otherwise dominates loading (three vocabulary lookups and one insert per merge).
#define MERGE_BATCH 32

struct merge_job {
    const char *a, *b; // as written, for error messages
    size_t na, nb;
    size_t off, ka, kb; // decoded bytes of a then b in the batch buffer
    uint64_t ha, hb, hm;
    int32_t ia, ib, im;
};

static int32_t vocab_find_h(const struct tokenizer *t, const char *s, size_t n, uint64_t h) {
    uint32_t tag = (uint32_t)(h >> 32);
    for (size_t i = (size_t)h & t->vocab_mask;; i = (i + 1) & t->vocab_mask) {
        uint64_t v = t->vocab_slots[i];
        if (!v) return -1;
        if ((uint32_t)(v >> 32) != tag) continue;
        int32_t id = (int32_t)((uint32_t)v - 1);
        if (t->len[id] == n && !memcmp(t->bytes + t->off[id], s, n)) return id;
    }
}

static int load_merges(struct tokenizer *t, const struct jv *merges, struct wren_err *e) {
    int n = merges->n;
    size_t cap = pow2_at_least((size_t)n * 2 + 1);
    t->merges.keys = xmalloc(cap * sizeof(uint64_t));
    t->merges.vals = xmalloc(cap * sizeof(uint64_t));
    memset(t->merges.keys, 0xFF, cap * sizeof(uint64_t));
    t->merges.mask = cap - 1;
    struct merge_job job[MERGE_BATCH];
    size_t bcap = 4096;
    char *buf = xmalloc(bcap);
    uint32_t rank = 0;
    const struct jv *m = merges->child;
    while (m) {
        int nj = 0;
        size_t used = 0;
        for (; m && nj < MERGE_BATCH; m = m->next, nj++) {
            struct merge_job *j = &job[nj];
            if (merge_parts(m, &j->a, &j->na, &j->b, &j->nb)) {
                free(buf);
                return wren_errf(e, "merge %u is neither \"a b\" nor [\"a\", \"b\"]", rank + nj);
            }
            if (used + j->na + j->nb > bcap) buf = xrealloc(buf, bcap = 2 * (used + j->na + j->nb));
            j->off = used;
            j->ka = token_bytes_of(j->a, j->na, buf + used);
            j->kb = token_bytes_of(j->b, j->nb, buf + used + j->ka);
            used += j->ka + j->kb;
        }
        for (int k = 0; k < nj; k++) {
            struct merge_job *j = &job[k];
            const char *s = buf + j->off;
            j->ha = tok_hash(s, j->ka), j->hb = tok_hash(s + j->ka, j->kb);
            j->hm = tok_hash(s, j->ka + j->kb);
            __builtin_prefetch(&t->vocab_slots[(size_t)j->ha & t->vocab_mask]);
            __builtin_prefetch(&t->vocab_slots[(size_t)j->hb & t->vocab_mask]);
            __builtin_prefetch(&t->vocab_slots[(size_t)j->hm & t->vocab_mask]);
        }
        for (int k = 0; k < nj; k++) {
            struct merge_job *j = &job[k];
            const char *s = buf + j->off;
            j->ia = vocab_find_h(t, s, j->ka, j->ha);
            j->ib = vocab_find_h(t, s + j->ka, j->kb, j->hb);
            j->im = vocab_find_h(t, s, j->ka + j->kb, j->hm);
            if (j->ia < 0 || j->ib < 0 || j->im < 0) {
                int rc = wren_errf(e,
                                   "merge %u (\"%.*s\" + \"%.*s\") uses a token missing from the "
                                   "vocabulary",
                                   rank + (uint32_t)k, (int)(j->na < 64 ? j->na : 64), j->a,
                                   (int)(j->nb < 64 ? j->nb : 64), j->b);
                free(buf);
                return rc;
            }
            uint64_t key = ((uint64_t)(uint32_t)j->ia << 32) | (uint32_t)j->ib;
            __builtin_prefetch(&t->merges.keys[merge_slot(&t->merges, key)]);
        }
        for (int k = 0; k < nj; k++)
            merge_insert(&t->merges, job[k].ia, job[k].ib, rank++, job[k].im);
    }
    free(buf);
    return 0;
}

static int load_added(struct tokenizer *t, const struct jv *list, size_t *used,
                      struct wren_err *e) {
    int n = list->n;
    t->added = xcalloc((size_t)(n ? n : 1), sizeof *t->added);
    size_t total = 0;
    for (const struct jv *a = list->child; a; a = a->next) {
        const struct jv *c = jv_get(a, "content");
        if (jv_is(c, JV_STRING)) total += c->len + 1;
    }
    t->added_arena = xmalloc(total + 1);
    size_t at = 0;
    int k = 0;
    for (const struct jv *a = list->child; a; a = a->next, k++) {
        struct added_token *x = &t->added[t->n_added];
        const struct jv *c = jv_get(a, "content");
        if (!jv_is(a, JV_OBJECT) || !jv_is(c, JV_STRING) || !c->str[0])
            return wren_errf(e, "added_tokens[%d]: needs a non-empty string \"content\"", k);
        if (get_id(jv_get(a, "id"), &x->id) || x->id >= t->n_ids)
            return wren_errf(e, "added_tokens[%d]: \"id\" must be an integer in [0, %d)", k,
                             MAX_IDS);
        if (jv_get_bool(a, "special", false, &x->special, e) ||
            jv_get_bool(a, "lstrip", false, &x->lstrip, e) ||
            jv_get_bool(a, "rstrip", false, &x->rstrip, e) ||
            jv_get_bool(a, "single_word", false, &x->single_word, e) ||
            jv_get_bool(a, "normalized", !x->special, &x->normalized, e))
            return wren_err_prefix(e, "added_tokens[%d]: ", k);
        x->len = c->len;
        if (utf8_valid_prefix(c->str, x->len) != x->len)
            return wren_errf(e, "added_tokens[%d]: content is not valid UTF-8", k);
        x->content = memcpy(t->added_arena + at, c->str, x->len + 1);
        at += x->len + 1;
        // The same content twice: the tokenizers library keeps one entry, the last.
        int dup = -1;
        for (int j = 0; j < t->n_added; j++)
            if (t->added[j].len == x->len && !memcmp(t->added[j].content, x->content, x->len))
                dup = j;
        if (dup >= 0) {
            t->added[dup] = *x;
            x = &t->added[dup];
        } else {
            t->n_added++;
        }
        set_token(t, used, x->id, x->content, x->len);
        t->special[x->id] = x->special;
        t->added_first[x->normalized][(unsigned char)x->content[0]] = true;
        t->n_added_kind[x->normalized]++;
    }
    return 0;
}

static int load_json(struct tokenizer *t, const struct jv *root, struct wren_err *e) {
    if (!jv_is(root, JV_OBJECT)) return wren_errf(e, "the top level is not a JSON object");
    const struct jv *model = jv_get(root, "model");
    if (!jv_is(model, JV_OBJECT)) return wren_errf(e, "missing \"model\" object");
    const char *ty = jv_type(model);
    if (ty && strcmp(ty, "BPE")) return wren_errf(e, "unsupported model type %s (only BPE)", ty);
    const struct jv *vocab = jv_get(model, "vocab");
    const struct jv *merges = jv_get(model, "merges");
    if (!jv_is(vocab, JV_OBJECT))
        return wren_errf(e, "model.vocab must be an object of token -> id");
    if (!jv_is(merges, JV_ARRAY)) return wren_errf(e, "model.merges must be an array");
    bool byte_fallback = false;
    if (jv_get_bool(model, "byte_fallback", false, &byte_fallback, e) ||
        jv_get_bool(model, "ignore_merges", false, &t->ignore_merges, e))
        return wren_err_prefix(e, "model: ");
    if (byte_fallback) return wren_errf(e, "unsupported BPE option byte_fallback=true");
    if (!empty_or_null(model, "continuing_subword_prefix") ||
        !empty_or_null(model, "end_of_word_suffix"))
        return wren_errf(e, "unsupported BPE subword prefix/suffix");
    const struct jv *dropout = jv_get(model, "dropout");
    if (dropout && !jv_is(dropout, JV_NULL) && !(jv_is(dropout, JV_NUMBER) && dropout->num == 0))
        return wren_errf(e, "unsupported BPE dropout (inference uses none)");

    const struct jv *added = jv_get(root, "added_tokens");
    if (added && !jv_is(added, JV_NULL) && !jv_is(added, JV_ARRAY))
        return wren_errf(e, "\"added_tokens\" must be an array");

    // Sizes first: the largest id and the bytes all token strings need.
    int32_t max_id = -1;
    size_t bytes = 0, n_vocab = 0;
    for (const struct jv *v = vocab->child; v; v = v->next, n_vocab++) {
        int32_t id;
        if (get_id(v, &id))
            return wren_errf(e, "model.vocab[\"%.64s\"]: id must be an integer in [0, %d)", v->key,
                             MAX_IDS);
        if (id > max_id) max_id = id;
        bytes += v->key_len;
    }
    if (!n_vocab) return wren_errf(e, "model.vocab is empty");
    if (jv_is(added, JV_ARRAY))
        for (const struct jv *a = added->child; a; a = a->next) {
            int32_t id;
            const struct jv *c = jv_get(a, "content");
            if (!get_id(jv_get(a, "id"), &id) && id > max_id) max_id = id;
            if (jv_is(c, JV_STRING)) bytes += c->len;
        }
    t->n_ids = max_id + 1;
    t->bytes = xmalloc(bytes + 1);
    t->off = xcalloc((size_t)t->n_ids, sizeof(uint32_t));
    t->len = xmalloc((size_t)t->n_ids * sizeof(uint32_t));
    memset(t->len, 0xFF, (size_t)t->n_ids * sizeof(uint32_t));
    t->special = xcalloc((size_t)t->n_ids, 1);

    size_t used = 0;
    for (const struct jv *v = vocab->child; v; v = v->next) {
        int32_t id = (int32_t)v->num;
        if (t->len[id] != UINT32_MAX)
            return wren_errf(e, "model.vocab: id %d is used by two tokens", id);
        set_token(t, &used, id, v->key, v->key_len);
    }
    size_t cap = pow2_at_least(n_vocab * 2 + 1);
    t->vocab_slots = xcalloc(cap, sizeof(uint64_t));
    t->vocab_mask = cap - 1;
    // Hash everything first so the inserts can prefetch their slots ahead.
    uint64_t *hash = xmalloc((size_t)t->n_ids * sizeof *hash);
    for (int32_t id = 0; id < t->n_ids; id++)
        if (t->len[id] != UINT32_MAX) hash[id] = tok_hash(t->bytes + t->off[id], t->len[id]);
    for (int32_t id = 0; id < t->n_ids; id++) {
        if (id + 16 < t->n_ids && t->len[id + 16] != UINT32_MAX)
            __builtin_prefetch(&t->vocab_slots[(size_t)hash[id + 16] & t->vocab_mask], 1);
        if (t->len[id] != UINT32_MAX) vocab_insert(t, id, hash[id]);
    }
    free(hash);
    for (int b = 0; b < 256; b++) {
        char c = (char)b;
        t->byte_id[b] = tok_vocab_find(t, &c, 1);
    }
    if (load_merges(t, merges, e)) return wren_err_prefix(e, "model.merges: ");
    if (jv_is(added, JV_ARRAY) && load_added(t, added, &used, e)) return -1;
    if (tok_load_pipeline(t, root, e)) return -1;
    return 0;
}

struct tokenizer *tokenizer_load(const char *path, struct wren_err *e) {
    // A directory holding tokenizer.json, or the file itself.
    struct stat st;
    char *file;
    if (stat(path, &st)) {
        wren_errf(e, "tokenizer: %s: %s", path, strerror(errno));
        return NULL;
    }
    if (S_ISDIR(st.st_mode)) {
        size_t n = strlen(path) + sizeof "/tokenizer.json";
        file = xmalloc(n);
        snprintf(file, n, "%s/tokenizer.json", path);
    } else {
        file = xstrdup(path);
    }
    size_t len;
    char *text = read_file(file, &len, e);
    if (!text) {
        wren_err_prefix(e, "tokenizer: ");
        free(file);
        return NULL;
    }
    struct jv_doc *doc;
    struct jv *root = jv_parse(text, len, &doc, e);
    struct tokenizer *t = NULL;
    if (root) {
        t = xcalloc(1, sizeof *t);
        if (load_json(t, root, e)) {
            tokenizer_free(t);
            t = NULL;
        }
    }
    jv_free(doc);
    free(text);
    if (!t) {
        wren_err_prefix(e, "tokenizer: %s: ", file);
        free(file);
        return NULL;
    }
    free(file);
    t->cache = word_cache_new();
    return t;
}

void tokenizer_free(struct tokenizer *t) {
    if (!t) return;
    free(t->bytes);
    free(t->off);
    free(t->len);
    free(t->special);
    free(t->vocab_slots);
    free(t->merges.keys);
    free(t->merges.vals);
    free(t->added);
    free(t->added_arena);
    if (t->split_re) pcre2_code_free(t->split_re);
    word_cache_free(t->cache);
    free(t);
}

int tokenizer_n_vocab(const struct tokenizer *t) {
    return t->n_ids;
}

int32_t tokenizer_token_id(const struct tokenizer *t, const char *token) {
    size_t n = strlen(token);
    for (int i = 0; i < t->n_added; i++)
        if (t->added[i].len == n && !memcmp(t->added[i].content, token, n)) return t->added[i].id;
    char *buf = xmalloc(n + 1);
    size_t k = token_bytes_of(token, n, buf);
    int32_t id = tok_vocab_find(t, buf, k);
    free(buf);
    return id;
}

bool tokenizer_is_special(const struct tokenizer *t, int32_t id) {
    return id >= 0 && id < t->n_ids && t->special[id];
}

const char *tokenizer_token_bytes(const struct tokenizer *t, int32_t id, size_t *len) {
    if (id < 0 || id >= t->n_ids || t->len[id] == UINT32_MAX) return NULL;
    if (len) *len = t->len[id];
    return t->bytes + t->off[id];
}

size_t tokenizer_max_token_len(const struct tokenizer *t) {
    return t->max_len;
}
