// Loading a Hugging Face tokenizer.json of the byte-level BPE kind (Qwen2/3/3.5) into flat
// tables: token bytes by id, a hash of the vocabulary by raw bytes, a hash of merges by id pair.
// Everything the file says that this tokenizer cannot honour is an error, never ignored.
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <cjson/cJSON.h>

#include "text/bytelevel.h"
#include "text/tok_internal.h"
#include "text/utf8.h"
#include "util/util.h"

#define MAX_IDS (1 << 24)

uint64_t tok_hash(const void *p, size_t n) {
    const unsigned char *s = p;
    uint64_t h = 0x243F6A8885A308D3ull ^ (n * 0x9E3779B97F4A7C15ull);
    while (n >= 8) {
        uint64_t v;
        memcpy(&v, s, 8);
        h = (h ^ v) * 0xFF51AFD7ED558CCDull;
        h ^= h >> 32;
        s += 8, n -= 8;
    }
    uint64_t v = 0;
    memcpy(&v, s, n);
    h ^= v;
    // murmur3 finalizer: every input bit reaches the low bits used as the table index
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

int32_t tok_vocab_find(const struct tokenizer *t, const char *s, size_t n) {
    size_t i = (size_t)tok_hash(s, n) & t->vocab_mask;
    for (;; i = (i + 1) & t->vocab_mask) {
        uint32_t v = t->vocab_slots[i];
        if (!v) return -1;
        int32_t id = (int32_t)(v - 1);
        if (t->len[id] == n && !memcmp(t->bytes + t->off[id], s, n)) return id;
    }
}

static void vocab_insert(struct tokenizer *t, int32_t id) {
    const char *s = t->bytes + t->off[id];
    size_t n = t->len[id];
    size_t i = (size_t)tok_hash(s, n) & t->vocab_mask;
    for (;; i = (i + 1) & t->vocab_mask) {
        uint32_t v = t->vocab_slots[i];
        if (!v) {
            t->vocab_slots[i] = (uint32_t)id + 1;
            return;
        }
        // Two strings with the same bytes (possible only with characters outside the ByteLevel
        // alphabet): the first keeps the bytes, as a lookup can return only one.
        int32_t o = (int32_t)(v - 1);
        if (t->len[o] == n && !memcmp(t->bytes + t->off[o], s, n)) return;
    }
}

// Later duplicates replace earlier ones, as the tokenizers library's HashMap collect does.
static void merge_insert(struct merge_map *m, int32_t a, int32_t b, uint32_t rank, int32_t id) {
    uint64_t k = ((uint64_t)(uint32_t)a << 32) | (uint32_t)b;
    size_t i = (size_t)((k * 0x9E3779B97F4A7C15ull) >> 20) & m->mask;
    for (; m->keys[i] != UINT64_MAX && m->keys[i] != k; i = (i + 1) & m->mask) {}
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

static int get_bool(const cJSON *o, const char *key, bool dflt, bool *out, struct wren_err *e) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!v || cJSON_IsNull(v)) {
        *out = dflt;
        return 0;
    }
    if (!cJSON_IsBool(v)) return wren_errf(e, "\"%s\" must be true or false", key);
    *out = cJSON_IsTrue(v);
    return 0;
}

static int get_id(const cJSON *v, int32_t *out) {
    if (!cJSON_IsNumber(v)) return -1;
    double d = v->valuedouble;
    if (!(d >= 0 && d < MAX_IDS) || d != (double)(int32_t)d) return -1;
    *out = (int32_t)d;
    return 0;
}

static const char *type_of(const cJSON *o) {
    const cJSON *ty = cJSON_GetObjectItemCaseSensitive(o, "type");
    return cJSON_IsString(ty) ? ty->valuestring : NULL;
}

static bool str_is(const cJSON *o, const char *key, const char *want) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsString(v) && !strcmp(v->valuestring, want);
}

// Missing and empty-string options are equivalent in the tokenizers library.
static bool empty_or_null(const cJSON *o, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    return !v || cJSON_IsNull(v) || (cJSON_IsString(v) && !v->valuestring[0]);
}

static int load_normalizer(struct tokenizer *t, const cJSON *n, struct wren_err *e) {
    if (!n || cJSON_IsNull(n)) return 0;
    const char *ty = type_of(n);
    if (ty && !strcmp(ty, "NFC")) {
        t->nfc = true;
        return 0;
    }
    if (ty && !strcmp(ty, "Sequence")) {
        const cJSON *list = cJSON_GetObjectItemCaseSensitive(n, "normalizers");
        if (!cJSON_IsArray(list)) return wren_errf(e, "normalizer Sequence needs a \"normalizers\" list");
        for (const cJSON *it = list->child; it; it = it->next)
            if (load_normalizer(t, it, e)) return -1;
        return 0;
    }
    return wren_errf(e, "unsupported normalizer %s (only NFC is implemented)", ty ? ty : "(no type)");
}

static int load_split(struct tokenizer *t, const cJSON *s, struct wren_err *e) {
    if (t->split_re) return wren_errf(e, "unsupported pre-tokenizer: more than one Split");
    if (!str_is(s, "behavior", "Isolated"))
        return wren_errf(e, "unsupported Split behavior (only \"Isolated\" is implemented)");
    bool invert = false;
    if (get_bool(s, "invert", false, &invert, e)) return -1;
    if (invert) return wren_errf(e, "unsupported Split with invert=true");
    const cJSON *pat = cJSON_GetObjectItemCaseSensitive(s, "pattern");
    const cJSON *re = cJSON_GetObjectItemCaseSensitive(pat, "Regex");
    const cJSON *lit = cJSON_GetObjectItemCaseSensitive(pat, "String");
    const cJSON *p = cJSON_IsString(re) ? re : lit;
    if (!cJSON_IsString(p) || !p->valuestring[0])
        return wren_errf(e, "Split needs a pattern {\"Regex\": \"...\"} or {\"String\": \"...\"}");
    t->split_re = tok_regex_compile(p->valuestring, strlen(p->valuestring), p == lit, e);
    return t->split_re ? 0 : -1;
}

static int check_bytelevel(const cJSON *b, const char *what, bool pre, struct wren_err *e) {
    bool prefix = false, use_regex = false;
    if (get_bool(b, "add_prefix_space", true, &prefix, e)) return -1;
    if (get_bool(b, "use_regex", true, &use_regex, e)) return -1;
    if (prefix && pre) return wren_errf(e, "unsupported %s ByteLevel with add_prefix_space=true", what);
    if (use_regex && pre)
        return wren_errf(e, "unsupported %s ByteLevel with use_regex=true (the GPT-2 regex)", what);
    return 0;
}

static int load_pre_tokenizer(struct tokenizer *t, const cJSON *p, struct wren_err *e) {
    if (!p || cJSON_IsNull(p))
        return wren_errf(e, "missing pre_tokenizer (a byte-level BPE tokenizer needs ByteLevel)");
    const cJSON *one[1] = {p};
    const cJSON *list = NULL;
    const char *ty = type_of(p);
    if (ty && !strcmp(ty, "Sequence")) {
        list = cJSON_GetObjectItemCaseSensitive(p, "pretokenizers");
        if (!cJSON_IsArray(list)) return wren_errf(e, "pre_tokenizer Sequence needs a \"pretokenizers\" list");
    }
    bool byte_level = false;
    for (const cJSON *it = list ? list->child : one[0]; it; it = list ? it->next : NULL) {
        const char *k = type_of(it);
        if (k && !strcmp(k, "Split")) {
            if (byte_level) return wren_errf(e, "unsupported pre-tokenizer order: Split after ByteLevel");
            if (load_split(t, it, e)) return -1;
        } else if (k && !strcmp(k, "ByteLevel")) {
            if (check_bytelevel(it, "pre-tokenizer", true, e)) return -1;
            byte_level = true;
        } else {
            return wren_errf(e, "unsupported pre-tokenizer %s (Split and ByteLevel are implemented)",
                             k ? k : "(no type)");
        }
    }
    if (!byte_level) return wren_errf(e, "unsupported pre-tokenizer: no ByteLevel step");
    return 0;
}

static int load_decoder(const cJSON *d, struct wren_err *e) {
    if (!d || cJSON_IsNull(d)) return 0;
    const char *ty = type_of(d);
    if (ty && !strcmp(ty, "ByteLevel")) return 0;
    return wren_errf(e, "unsupported decoder %s (only ByteLevel is implemented)", ty ? ty : "(no type)");
}

// A merge as "a b" or ["a", "b"]; sets the two halves (pointing into the JSON or into buf).
static int merge_parts(const cJSON *m, const char **a, size_t *na, const char **b, size_t *nb) {
    if (cJSON_IsString(m)) {
        const char *s = m->valuestring, *sp = strchr(s, ' ');
        if (!sp || strchr(sp + 1, ' ')) return -1;
        *a = s, *na = (size_t)(sp - s), *b = sp + 1, *nb = strlen(sp + 1);
        return 0;
    }
    if (cJSON_IsArray(m) && cJSON_GetArraySize(m) == 2 && cJSON_IsString(m->child) &&
        cJSON_IsString(m->child->next)) {
        *a = m->child->valuestring, *na = strlen(*a);
        *b = m->child->next->valuestring, *nb = strlen(*b);
        return 0;
    }
    return -1;
}

static int load_merges(struct tokenizer *t, const cJSON *merges, struct wren_err *e) {
    int n = cJSON_GetArraySize(merges);
    size_t cap = pow2_at_least((size_t)n * 2 + 1);
    t->merges.keys = xmalloc(cap * sizeof(uint64_t));
    t->merges.vals = xmalloc(cap * sizeof(uint64_t));
    memset(t->merges.keys, 0xFF, cap * sizeof(uint64_t));
    t->merges.mask = cap - 1;
    size_t bcap = 256;
    char *buf = xmalloc(bcap);
    uint32_t rank = 0;
    int rc = 0;
    for (const cJSON *m = merges->child; m; m = m->next, rank++) {
        const char *a, *b;
        size_t na, nb;
        if (merge_parts(m, &a, &na, &b, &nb)) {
            rc = wren_errf(e, "merge %u is neither \"a b\" nor [\"a\", \"b\"]", rank);
            break;
        }
        if (2 * (na + nb) > bcap) buf = xrealloc(buf, bcap = 2 * (na + nb));
        size_t ka = token_bytes_of(a, na, buf);
        size_t kb = token_bytes_of(b, nb, buf + ka);
        int32_t ia = tok_vocab_find(t, buf, ka), ib = tok_vocab_find(t, buf + ka, kb);
        int32_t im = tok_vocab_find(t, buf, ka + kb);
        if (ia < 0 || ib < 0 || im < 0) {
            rc = wren_errf(e, "merge %u (\"%.*s\" + \"%.*s\") uses a token missing from the vocabulary",
                           rank, (int)(na < 64 ? na : 64), a, (int)(nb < 64 ? nb : 64), b);
            break;
        }
        merge_insert(&t->merges, ia, ib, rank, im);
    }
    free(buf);
    return rc;
}

static int load_added(struct tokenizer *t, const cJSON *list, size_t *used, struct wren_err *e) {
    int n = cJSON_GetArraySize(list);
    t->added = xcalloc((size_t)(n ? n : 1), sizeof *t->added);
    size_t total = 0;
    for (const cJSON *a = list->child; a; a = a->next) {
        const cJSON *c = cJSON_GetObjectItemCaseSensitive(a, "content");
        if (cJSON_IsString(c)) total += strlen(c->valuestring) + 1;
    }
    t->added_arena = xmalloc(total + 1);
    size_t at = 0;
    int k = 0;
    for (const cJSON *a = list->child; a; a = a->next, k++) {
        struct added_token *x = &t->added[t->n_added];
        const cJSON *c = cJSON_GetObjectItemCaseSensitive(a, "content");
        if (!cJSON_IsObject(a) || !cJSON_IsString(c) || !c->valuestring[0])
            return wren_errf(e, "added_tokens[%d]: needs a non-empty string \"content\"", k);
        if (get_id(cJSON_GetObjectItemCaseSensitive(a, "id"), &x->id) || x->id >= t->n_ids)
            return wren_errf(e, "added_tokens[%d]: \"id\" must be an integer in [0, %d)", k, MAX_IDS);
        if (get_bool(a, "special", false, &x->special, e) ||
            get_bool(a, "lstrip", false, &x->lstrip, e) ||
            get_bool(a, "rstrip", false, &x->rstrip, e) ||
            get_bool(a, "single_word", false, &x->single_word, e) ||
            get_bool(a, "normalized", !x->special, &x->normalized, e))
            return wren_err_prefix(e, "added_tokens[%d]: ", k);
        x->len = strlen(c->valuestring);
        if (utf8_valid_prefix(c->valuestring, x->len) != x->len)
            return wren_errf(e, "added_tokens[%d]: content is not valid UTF-8", k);
        x->content = memcpy(t->added_arena + at, c->valuestring, x->len + 1);
        at += x->len + 1;
        // The same content twice: the tokenizers library keeps one entry, the last.
        int dup = -1;
        for (int j = 0; j < t->n_added; j++)
            if (t->added[j].len == x->len && !memcmp(t->added[j].content, x->content, x->len)) dup = j;
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

static int load_json(struct tokenizer *t, const cJSON *root, struct wren_err *e) {
    if (!cJSON_IsObject(root)) return wren_errf(e, "the top level is not a JSON object");
    const cJSON *model = cJSON_GetObjectItemCaseSensitive(root, "model");
    if (!cJSON_IsObject(model)) return wren_errf(e, "missing \"model\" object");
    const char *ty = type_of(model);
    if (ty && strcmp(ty, "BPE")) return wren_errf(e, "unsupported model type %s (only BPE)", ty);
    const cJSON *vocab = cJSON_GetObjectItemCaseSensitive(model, "vocab");
    const cJSON *merges = cJSON_GetObjectItemCaseSensitive(model, "merges");
    if (!cJSON_IsObject(vocab)) return wren_errf(e, "model.vocab must be an object of token -> id");
    if (!cJSON_IsArray(merges)) return wren_errf(e, "model.merges must be an array");
    bool byte_fallback = false;
    if (get_bool(model, "byte_fallback", false, &byte_fallback, e) ||
        get_bool(model, "ignore_merges", false, &t->ignore_merges, e))
        return wren_err_prefix(e, "model: ");
    if (byte_fallback) return wren_errf(e, "unsupported BPE option byte_fallback=true");
    if (!empty_or_null(model, "continuing_subword_prefix") ||
        !empty_or_null(model, "end_of_word_suffix"))
        return wren_errf(e, "unsupported BPE subword prefix/suffix");
    const cJSON *dropout = cJSON_GetObjectItemCaseSensitive(model, "dropout");
    if (dropout && !cJSON_IsNull(dropout) && !(cJSON_IsNumber(dropout) && dropout->valuedouble == 0))
        return wren_errf(e, "unsupported BPE dropout (inference uses none)");

    const cJSON *added = cJSON_GetObjectItemCaseSensitive(root, "added_tokens");
    if (added && !cJSON_IsNull(added) && !cJSON_IsArray(added))
        return wren_errf(e, "\"added_tokens\" must be an array");

    // Sizes first: the largest id and the bytes all token strings need.
    int32_t max_id = -1;
    size_t bytes = 0, n_vocab = 0;
    for (const cJSON *v = vocab->child; v; v = v->next, n_vocab++) {
        int32_t id;
        if (get_id(v, &id))
            return wren_errf(e, "model.vocab[\"%.64s\"]: id must be an integer in [0, %d)", v->string,
                             MAX_IDS);
        if (id > max_id) max_id = id;
        bytes += strlen(v->string);
    }
    if (!n_vocab) return wren_errf(e, "model.vocab is empty");
    if (cJSON_IsArray(added))
        for (const cJSON *a = added->child; a; a = a->next) {
            int32_t id;
            const cJSON *c = cJSON_GetObjectItemCaseSensitive(a, "content");
            if (!get_id(cJSON_GetObjectItemCaseSensitive(a, "id"), &id) && id > max_id) max_id = id;
            if (cJSON_IsString(c)) bytes += strlen(c->valuestring);
        }
    t->n_ids = max_id + 1;
    t->bytes = xmalloc(bytes + 1);
    t->off = xcalloc((size_t)t->n_ids, sizeof(uint32_t));
    t->len = xmalloc((size_t)t->n_ids * sizeof(uint32_t));
    memset(t->len, 0xFF, (size_t)t->n_ids * sizeof(uint32_t));
    t->special = xcalloc((size_t)t->n_ids, 1);

    size_t used = 0;
    for (const cJSON *v = vocab->child; v; v = v->next) {
        int32_t id = (int32_t)v->valuedouble;
        if (t->len[id] != UINT32_MAX)
            return wren_errf(e, "model.vocab: id %d is used by two tokens", id);
        set_token(t, &used, id, v->string, strlen(v->string));
    }
    size_t cap = pow2_at_least(n_vocab * 2 + 1);
    t->vocab_slots = xcalloc(cap, sizeof(uint32_t));
    t->vocab_mask = cap - 1;
    for (int32_t id = 0; id < t->n_ids; id++)
        if (t->len[id] != UINT32_MAX) vocab_insert(t, id);
    for (int b = 0; b < 256; b++) {
        char c = (char)b;
        t->byte_id[b] = tok_vocab_find(t, &c, 1);
    }
    if (load_merges(t, merges, e)) return wren_err_prefix(e, "model.merges: ");
    if (cJSON_IsArray(added) && load_added(t, added, &used, e)) return -1;
    if (load_normalizer(t, cJSON_GetObjectItemCaseSensitive(root, "normalizer"), e)) return -1;
    if (load_pre_tokenizer(t, cJSON_GetObjectItemCaseSensitive(root, "pre_tokenizer"), e)) return -1;
    if (load_decoder(cJSON_GetObjectItemCaseSensitive(root, "decoder"), e)) return -1;
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
    cJSON *root = cJSON_ParseWithLength(text, len);
    if (!root) {
        const char *at = cJSON_GetErrorPtr();
        size_t off = at && at >= text && at <= text + len ? (size_t)(at - text) : 0;
        wren_errf(e, "tokenizer: %s: not valid JSON (near byte %zu)", file, off);
        free(text);
        free(file);
        return NULL;
    }
    free(text);
    struct tokenizer *t = xcalloc(1, sizeof *t);
    int rc = load_json(t, root, e);
    cJSON_Delete(root);
    if (rc) {
        wren_err_prefix(e, "tokenizer: %s: ", file);
        free(file);
        tokenizer_free(t);
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

int tokenizer_n_vocab(const struct tokenizer *t) { return t->n_ids; }

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

size_t tokenizer_max_token_len(const struct tokenizer *t) { return t->max_len; }
