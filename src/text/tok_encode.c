// Encoding, in the order the tokenizers library applies its steps: added tokens are cut out of
// the raw text, each remaining span is NFC-normalized, cut again at normalized added tokens,
// split by the pre-tokenizer regex (each match and each gap between matches is one pre-token),
// and every pre-token is merged by BPE on its raw bytes (ByteLevel is a 1:1 relabelling of
// bytes, so it needs no work here).
#include <stdlib.h>
#include <string.h>

#include <utf8proc.h>

#include "text/tok_internal.h"
#include "text/utf8.h"
#include "util/util.h"

struct enc {
    const struct tokenizer *t;
    int32_t *ids;
    size_t n, cap;
    uint32_t *scratch; // BPE working memory, grown to the longest pre-token
    size_t scratch_cap;
    pcre2_match_data *md;
    pcre2_match_context *mctx; // only once a match needed a bigger JIT stack
    pcre2_jit_stack *jit_stack;
    struct word_cache *cache; // NULL while another thread holds it
    struct wren_err *e;
};

static void reserve(struct enc *st, size_t more) {
    if (st->n + more <= st->cap) return;
    st->cap = (st->n + more) * 2;
    st->ids = xrealloc(st->ids, st->cap * sizeof *st->ids);
}

static void emit(struct enc *st, int32_t id) {
    reserve(st, 1);
    st->ids[st->n++] = id;
}

static void encode_word(struct enc *st, const char *w, size_t n) {
    const struct tokenizer *t = st->t;
    reserve(st, n);
    int32_t *out = st->ids + st->n;
    uint64_t h = 0;
    bool cached = st->cache && n <= WORD_CACHE_MAX_KEY;
    if (cached) {
        h = tok_hash(w, n);
        int k = word_cache_get(st->cache, w, n, h, out);
        if (k >= 0) {
            st->n += (size_t)k;
            return;
        }
    }
    if (9 * n + 16 > st->scratch_cap) {
        st->scratch_cap = 9 * n + 16;
        free(st->scratch);
        st->scratch = xmalloc(st->scratch_cap * sizeof *st->scratch);
    }
    size_t k = tok_bpe(t, (const unsigned char *)w, n, out, st->scratch);
    if (cached) word_cache_put(st->cache, w, n, h, out, (int)k);
    st->n += k;
}

static int regex_match(struct enc *st, const char *s, size_t n, size_t from) {
    int rc =
        pcre2_match(st->t->split_re, (PCRE2_SPTR)s, n, from, PCRE2_NO_UTF_CHECK, st->md, st->mctx);
    if (rc == PCRE2_ERROR_JIT_STACKLIMIT && !st->jit_stack) {
        // Pathological input (very long runs): retry once with a large JIT stack.
        st->jit_stack = pcre2_jit_stack_create(64 << 10, 64 << 20, NULL);
        st->mctx = pcre2_match_context_create(NULL);
        if (!st->jit_stack || !st->mctx) return PCRE2_ERROR_NOMEMORY;
        pcre2_jit_stack_assign(st->mctx, NULL, st->jit_stack);
        rc = pcre2_match(st->t->split_re, (PCRE2_SPTR)s, n, from, PCRE2_NO_UTF_CHECK, st->md,
                         st->mctx);
    }
    return rc;
}

// Pre-tokenizer: regex matches and the gaps between them are the words.
static int encode_span(struct enc *st, const char *s, size_t n) {
    if (!n) return 0;
    if (!st->t->split_re) {
        encode_word(st, s, n);
        return 0;
    }
    size_t gap = 0, from = 0;
    while (from < n) {
        int rc = regex_match(st, s, n, from);
        if (rc == PCRE2_ERROR_NOMATCH) break;
        if (rc < 0) {
            PCRE2_UCHAR msg[256];
            pcre2_get_error_message(rc, msg, sizeof msg);
            return wren_errf(st->e, "pre-tokenizer regex failed: %s", (const char *)msg);
        }
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(st->md);
        size_t ms = ov[0], me = ov[1];
        if (me == ms) { // an empty match splits nothing; step over one character
            from = ms + 1;
            while (from < n && ((unsigned char)s[from] & 0xC0) == 0x80) from++;
            continue;
        }
        if (ms > gap) encode_word(st, s + gap, ms - gap);
        encode_word(st, s + ms, me - ms);
        gap = from = me;
    }
    if (gap < n) encode_word(st, s + gap, n - gap);
    return 0;
}

static bool is_white_space(uint32_t c) {
    return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
           (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F ||
           c == 0x205F || c == 0x3000;
}

// Rust's regex \w: letters, marks, decimal digits, connector punctuation, joiners.
static bool is_word_char(uint32_t c) {
    if (c == 0x200C || c == 0x200D) return true;
    switch (utf8proc_category((utf8proc_int32_t)c)) {
    case UTF8PROC_CATEGORY_LU:
    case UTF8PROC_CATEGORY_LL:
    case UTF8PROC_CATEGORY_LT:
    case UTF8PROC_CATEGORY_LM:
    case UTF8PROC_CATEGORY_LO:
    case UTF8PROC_CATEGORY_NL:
    case UTF8PROC_CATEGORY_MN:
    case UTF8PROC_CATEGORY_MC:
    case UTF8PROC_CATEGORY_ME:
    case UTF8PROC_CATEGORY_ND:
    case UTF8PROC_CATEGORY_PC:
        return true;
    default:
        return false;
    }
}

static uint32_t char_at(const char *s, size_t n, size_t i) {
    uint32_t cp = 0;
    int bad;
    utf8_next((const unsigned char *)s + i, n - i, &cp, &bad);
    return cp;
}

static uint32_t char_before(const char *s, size_t i, size_t *start) {
    size_t j = i;
    do j--;
    while (j > 0 && ((unsigned char)s[j] & 0xC0) == 0x80);
    *start = j;
    return char_at(s, i, j);
}

// Leftmost-longest match of an added token of the given kind at or after `from`.
static const struct added_token *find_added(const struct tokenizer *t, int kind, const char *s,
                                            size_t n, size_t from, size_t *at) {
    const bool *first = t->added_first[kind];
    for (size_t i = from; i < n; i++) {
        if (!first[(unsigned char)s[i]]) continue;
        const struct added_token *best = NULL;
        for (int k = 0; k < t->n_added; k++) {
            const struct added_token *a = &t->added[k];
            if (a->normalized != kind || a->len > n - i || (best && a->len <= best->len)) continue;
            if (!memcmp(s + i, a->content, a->len)) best = a;
        }
        if (best) {
            *at = i;
            return best;
        }
    }
    return NULL;
}

static int encode_normalized(struct enc *st, const char *s, size_t n);

// Cuts s at added tokens of one kind (0: matched in the raw text, 1: in the normalized text),
// honouring their single_word / lstrip / rstrip flags as the tokenizers library does; the
// spans between go to `next`.
static int split_added(struct enc *st, int kind, const char *s, size_t n,
                       int (*next)(struct enc *, const char *, size_t)) {
    const struct tokenizer *t = st->t;
    size_t done = 0, from = 0, at;
    const struct added_token *a;
    while (t->n_added_kind[kind] && (a = find_added(t, kind, s, n, from, &at))) {
        size_t start = at, stop = at + a->len;
        from = stop;
        if (a->single_word) {
            size_t j;
            bool word_before = start > 0 && is_word_char(char_before(s, start, &j));
            bool word_after = stop < n && is_word_char(char_at(s, n, stop));
            if (word_before || word_after) continue;
        }
        if (a->lstrip) {
            size_t j;
            while (start > done && is_white_space(char_before(s, start, &j))) start = j;
        }
        if (a->rstrip) {
            while (stop < n && is_white_space(char_at(s, n, stop))) {
                stop++;
                while (stop < n && ((unsigned char)s[stop] & 0xC0) == 0x80) stop++;
            }
            from = stop;
        }
        if (start > done && next(st, s + done, start - done)) return -1;
        emit(st, a->id);
        done = stop;
    }
    return done < n ? next(st, s + done, n - done) : 0;
}

static int encode_normalized(struct enc *st, const char *s, size_t n) {
    return split_added(st, 1, s, n, encode_span);
}

// A character NFC can neither change nor combine with what precedes it: a starter (combining
// class 0) without a canonical decomposition that is never the second half of a composition.
// NFC(x + y) == NFC(x) + NFC(y) whenever y begins with one, so only the short windows around
// other characters need utf8proc; everything below U+0300 (ASCII, Latin-1) is stable.
static bool nfc_stable(uint32_t cp) {
    if (cp < 0x300) return true;
    if (cp >= 0x1100 && cp <= 0x11FF) return false; // conjoining jamo compose algorithmically
    if (cp >= 0xAC00 && cp <= 0xD7A3) return true;  // precomposed syllables: starters, NFC already
    const utf8proc_property_t *p = utf8proc_get_property((utf8proc_int32_t)cp);
    if (p->combining_class) return false;
    if (p->decomp_seqindex != UINT16_MAX && p->decomp_type == 0) return false; // canonical
    if (p->comb_index != UINT16_MAX && p->comb_index >= 0x8000) return false;  // a second half
    return true;
}

// Byte length and stability of the character at s[i] (valid UTF-8).
static size_t char_info(const char *s, size_t n, size_t i, bool *stable) {
    uint32_t cp = 0;
    int bad, k = utf8_next((const unsigned char *)s + i, n - i, &cp, &bad);
    *stable = nfc_stable(cp);
    return k > 0 ? (size_t)k : 1;
}

struct buf {
    char *p;
    size_t n, cap;
};

static void buf_put(struct buf *b, const char *s, size_t n) {
    if (!n) return;
    if (b->n + n > b->cap) b->p = xrealloc(b->p, b->cap = 2 * (b->n + n) + 64);
    memcpy(b->p + b->n, s, n);
    b->n += n;
}

static int encode_raw_span(struct enc *st, const char *s, size_t n) {
    if (!st->t->nfc) return encode_normalized(st, s, n);
    struct buf out = {0};
    size_t copied = 0, i = 0;
    bool changed = false;
    while (i < n) {
        if ((unsigned char)s[i] < 0xCC) { // ASCII, continuation bytes, code points < U+0300
            i++;
            continue;
        }
        bool stable;
        size_t k = char_info(s, n, i, &stable);
        if (stable) {
            i += k;
            continue;
        }
        // Window: the stable character before (it may compose with this one) up to the next
        // stable character.
        size_t ws = i, we = i + k;
        if (i > copied) {
            do ws--;
            while (ws > copied && ((unsigned char)s[ws] & 0xC0) == 0x80);
        }
        while (we < n && (unsigned char)s[we] >= 0x80) {
            size_t k2 = char_info(s, n, we, &stable);
            if (stable) break;
            we += k2;
        }
        buf_put(&out, s + copied, ws - copied);
        utf8proc_uint8_t *norm = NULL;
        utf8proc_ssize_t nk =
            utf8proc_map((const utf8proc_uint8_t *)s + ws, (utf8proc_ssize_t)(we - ws), &norm,
                         UTF8PROC_STABLE | UTF8PROC_COMPOSE);
        if (nk < 0) {
            free(out.p);
            return wren_errf(st->e, "NFC normalization failed: %s", utf8proc_errmsg(nk));
        }
        buf_put(&out, (const char *)norm, (size_t)nk);
        free(norm);
        copied = i = we;
        changed = true;
    }
    if (!changed) return encode_normalized(st, s, n); // nothing to normalize: no copy
    buf_put(&out, s + copied, n - copied);
    int rc = encode_normalized(st, out.p, out.n);
    free(out.p);
    return rc;
}

int tokenizer_encode(const struct tokenizer *t, const char *text, size_t len, int32_t **ids,
                     struct wren_err *e) {
    *ids = NULL;
    if (!text && len) return wren_errf(e, "no text given");
    size_t valid = utf8_valid_prefix(text, len);
    if (valid != len)
        return wren_errf(e, "the text is not valid UTF-8 (bad byte 0x%02X at offset %zu)",
                         (unsigned char)text[valid], valid);
    struct enc st = {.t = t, .e = e};
    st.cap = len / 3 + 16;
    st.ids = xmalloc(st.cap * sizeof *st.ids);
    if (t->split_re) {
        st.md = pcre2_match_data_create_from_pattern(t->split_re, NULL);
        if (!st.md) {
            free(st.ids);
            return wren_errf(e, "out of memory for the regex matcher");
        }
    }
    if (word_cache_acquire(t->cache)) st.cache = t->cache;
    int rc = split_added(&st, 0, text, len, encode_raw_span);
    if (st.cache) word_cache_release(st.cache);
    free(st.scratch);
    if (st.md) pcre2_match_data_free(st.md);
    if (st.mctx) pcre2_match_context_free(st.mctx);
    if (st.jit_stack) pcre2_jit_stack_free(st.jit_stack);
    if (rc) {
        free(st.ids);
        return -1;
    }
    if (st.n > INT32_MAX) {
        free(st.ids);
        return wren_errf(e, "text too long (more than 2^31 tokens)");
    }
    *ids = st.ids;
    return (int)st.n;
}
