// The pre-tokenizer regex of a tokenizer.json is written for the tokenizers library, which runs
// it with Oniguruma. PCRE2 agrees on nearly everything; the shorthand classes differ (PCRE2's \s
// also takes U+180E, its \w lacks marks, its \h means horizontal space, Oniguruma's hex digit),
// so those are rewritten as explicit classes before compiling.
#include <stdio.h>
#include <string.h>

#include "text/tok_internal.h"
#include "util/util.h"

// Unicode White_Space, which Oniguruma's \s matches.
#define SPACE_ITEMS                                                                                \
    "\\t\\n\\x0B\\f\\r\\x20\\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}"  \
    "\\x{205F}\\x{3000}"
#define WORD_ITEMS "\\p{L}\\p{M}\\p{Nd}\\p{Pc}"
#define HEX_ITEMS  "0-9a-fA-F"

struct sbuf {
    char *p;
    size_t n, cap;
};

static void put(struct sbuf *b, const char *s, size_t n) {
    if (b->n + n + 1 > b->cap) {
        b->cap = (b->n + n + 1) * 2;
        b->p = xrealloc(b->p, b->cap);
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
}

static void puts_(struct sbuf *b, const char *s) {
    put(b, s, strlen(s));
}

// Emits the replacement of shorthand class `c` (s, S, w, W, h, H); returns 0 if c is not one we
// rewrite. Negated forms inside a bracket cannot be inlined and are left to PCRE2.
static int shorthand(struct sbuf *b, char c, bool in_class) {
    const char *items;
    bool neg = false;
    switch (c) {
    case 'S':
        neg = true; /* fall through */
    case 's':
        items = SPACE_ITEMS;
        break;
    case 'W':
        neg = true; /* fall through */
    case 'w':
        items = WORD_ITEMS;
        break;
    case 'H':
        neg = true; /* fall through */
    case 'h':
        items = HEX_ITEMS;
        break;
    default:
        return 0;
    }
    if (in_class) {
        if (neg) return 0;
        puts_(b, items);
        return 1;
    }
    puts_(b, neg ? "[^" : "[");
    puts_(b, items);
    puts_(b, "]");
    return 1;
}

static char *translate(const char *s, size_t n) {
    struct sbuf b = {0};
    put(&b, "", 0);
    bool in_class = false;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (c == '\\' && i + 1 < n) {
            if (!shorthand(&b, s[i + 1], in_class)) put(&b, s + i, 2);
            i++;
            continue;
        }
        if (!in_class && c == '[') {
            in_class = true;
            put(&b, s + i, 1);
            // A ']' right after '[' or '[^' is a literal member.
            if (i + 1 < n && s[i + 1] == '^') put(&b, s + ++i, 1);
            if (i + 1 < n && s[i + 1] == ']') put(&b, s + ++i, 1);
            continue;
        }
        if (in_class && c == ']') in_class = false;
        put(&b, s + i, 1);
    }
    return b.p;
}

pcre2_code *tok_regex_compile(const char *pattern, size_t len, bool literal, struct wren_err *e) {
    char *pat = literal ? NULL : translate(pattern, len);
    int err;
    PCRE2_SIZE erroff;
    // Oniguruma's Ruby syntax (the tokenizers library's default) makes ^ and $ line anchors.
    uint32_t opts = PCRE2_UTF | PCRE2_UCP | (literal ? PCRE2_LITERAL : PCRE2_MULTILINE);
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)(literal ? pattern : pat),
                                   literal ? len : strlen(pat), opts, &err, &erroff, NULL);
    free(pat);
    if (!re) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(err, msg, sizeof msg);
        wren_errf(e,
                  "pre-tokenizer regex is invalid: %s (near offset %zu of the translated pattern)",
                  (const char *)msg, (size_t)erroff);
        return NULL;
    }
    // JIT makes splitting several times faster; without it pcre2_match still works.
    pcre2_jit_compile(re, PCRE2_JIT_COMPLETE);
    return re;
}
