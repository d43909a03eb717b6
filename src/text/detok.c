// Streaming detokenizer. Token bytes go through a small UTF-8 decoder that holds an incomplete
// character across pushes and replaces ill-formed sequences with U+FFFD exactly where
// String::from_utf8_lossy would on the whole stream (one per maximal subpart), so streamed and
// one-shot decoding print the same text.
#include <string.h>

#include "text/tok_internal.h"
#include "text/utf8.h"

static const char REPLACEMENT[3] = {(char)0xEF, (char)0xBF, (char)0xBD};

struct sink {
    char *out;
    size_t cap, n;
};

static void put(struct sink *s, const char *p, size_t k) {
    if (k > s->cap - s->n) k = s->cap - s->n; // never past the caller's buffer
    if (!k) return;
    memcpy(s->out + s->n, p, k);
    s->n += k;
}

// Decodes held bytes + p[0..k), writing complete characters and keeping an incomplete tail.
static void feed(struct detok *d, const char *p, size_t k, struct sink *s) {
    // Work on pending + as many new bytes as can complete it, then stream the rest directly.
    while (d->n_pending > 0) {
        unsigned char buf[8];
        int np = d->n_pending;
        memcpy(buf, d->pending, (size_t)np);
        size_t take = k < (size_t)(4 - np) ? k : (size_t)(4 - np);
        memcpy(buf + np, p, take);
        uint32_t cp;
        int bad, len = utf8_next(buf, (size_t)np + take, &cp, &bad);
        if (len > 0) { // completed: len > np since pending alone was incomplete
            put(s, (const char *)buf, (size_t)len);
            size_t used = (size_t)(len - np);
            p += used, k -= used;
            d->n_pending = 0;
        } else if (bad > 0) {
            put(s, REPLACEMENT, 3);
            // Drop the ill-formed prefix; the bytes after it are decoded afresh.
            if (bad >= np) {
                size_t used = (size_t)(bad - np);
                p += used, k -= used;
                d->n_pending = 0;
            } else {
                memmove(d->pending, d->pending + bad, (size_t)(np - bad));
                d->n_pending = np - bad;
            }
        } else { // still incomplete: everything new is held
            memcpy(d->pending + np, p, take);
            d->n_pending = np + (int)take;
            return;
        }
    }
    size_t i = 0;
    while (i < k) {
        size_t run = i;
        while (run < k && (unsigned char)p[run] < 0x80) run++;
        if (run > i) {
            put(s, p + i, run - i);
            i = run;
            continue;
        }
        uint32_t cp;
        int bad, len = utf8_next((const unsigned char *)p + i, k - i, &cp, &bad);
        if (len > 0) {
            put(s, p + i, (size_t)len);
            i += (size_t)len;
        } else if (bad > 0) {
            put(s, REPLACEMENT, 3);
            i += (size_t)bad;
        } else { // incomplete at the end of this token: hold it
            memcpy(d->pending, p + i, k - i);
            d->n_pending = (int)(k - i);
            return;
        }
    }
}

size_t detok_push(const struct tokenizer *t, struct detok *d, int32_t id, char *out, size_t cap) {
    size_t len;
    const char *b = tokenizer_token_bytes(t, id, &len);
    struct sink s = {out, cap, 0};
    if (d->n_pending < 0 || d->n_pending > 3) d->n_pending = 0; // never trust a corrupt state
    if (b) feed(d, b, len, &s);
    return s.n;
}

size_t detok_flush(struct detok *d, char *out, size_t cap) {
    struct sink s = {out, cap, 0};
    // Held bytes are an incomplete character: one U+FFFD, as from_utf8_lossy gives at the end.
    if (d->n_pending > 0) put(&s, REPLACEMENT, 3);
    d->n_pending = 0;
    return s.n;
}

size_t detok_out_cap(const struct tokenizer *t) {
    return 3 * (tokenizer_max_token_len(t) + 4);
}
