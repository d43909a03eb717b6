#include "text/tok_json.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "text/utf8.h"
#include "util/util.h"

#define BLOCK     65536 // values per arena block
#define MAX_DEPTH 256

struct jv_block {
    struct jv_block *prev;
    struct jv v[BLOCK];
};

struct jv_doc {
    struct jv_block *last;
    size_t used; // in last
};

struct parser {
    char *s, *end, *base;
    struct jv_doc *doc;
    struct wren_err *e;
    int depth;
};

static struct jv *new_value(struct parser *p) {
    struct jv_doc *d = p->doc;
    if (!d->last || d->used == BLOCK) {
        struct jv_block *b = xmalloc(sizeof *b);
        b->prev = d->last;
        d->last = b;
        d->used = 0;
    }
    struct jv *v = &d->last->v[d->used++];
    memset(v, 0, sizeof *v);
    return v;
}

static int fail(struct parser *p, const char *what) {
    return wren_errf(p->e, "not valid JSON: %s at byte %zu", what, (size_t)(p->s - p->base));
}

static void skip_ws(struct parser *p) {
    while (p->s < p->end && (*p->s == ' ' || *p->s == '\n' || *p->s == '\r' || *p->s == '\t'))
        p->s++;
}

static int hex4(const char *s, uint32_t *out) {
    uint32_t v = 0;
    for (int i = 0; i < 4; i++) {
        char c = s[i];
        v <<= 4;
        if (c >= '0' && c <= '9')
            v |= (uint32_t)(c - '0');
        else if (c >= 'a' && c <= 'f')
            v |= (uint32_t)(c - 'a' + 10);
        else if (c >= 'A' && c <= 'F')
            v |= (uint32_t)(c - 'A' + 10);
        else
            return -1;
    }
    *out = v;
    return 0;
}

// Decodes the string at p->s (just past the opening quote) in place.
static int parse_string(struct parser *p, char **out, size_t *out_len) {
    char *w = p->s, *start = p->s;
    for (;;) {
        // Plain bytes run until a quote, a backslash or a control character.
        char *r = p->s;
        while (r < p->end && *r != '"' && *r != '\\' && (unsigned char)*r >= 0x20) r++;
        if (w != p->s) memmove(w, p->s, (size_t)(r - p->s));
        w += r - p->s;
        p->s = r;
        if (r >= p->end) return fail(p, "unterminated string");
        if (*r == '"') break;
        if ((unsigned char)*r < 0x20) return fail(p, "control character in a string");
        if (p->end - r < 2) return fail(p, "unterminated escape");
        char c = r[1];
        p->s = r + 2;
        switch (c) {
        case '"':
            *w++ = '"';
            break;
        case '\\':
            *w++ = '\\';
            break;
        case '/':
            *w++ = '/';
            break;
        case 'b':
            *w++ = '\b';
            break;
        case 'f':
            *w++ = '\f';
            break;
        case 'n':
            *w++ = '\n';
            break;
        case 'r':
            *w++ = '\r';
            break;
        case 't':
            *w++ = '\t';
            break;
        case 'u': {
            uint32_t cp, lo;
            if (p->end - p->s < 4 || hex4(p->s, &cp)) return fail(p, "bad \\u escape");
            p->s += 4;
            if (cp >= 0xDC00 && cp <= 0xDFFF) return fail(p, "lone surrogate escape");
            if (cp >= 0xD800 && cp <= 0xDBFF) {
                if (p->end - p->s < 6 || p->s[0] != '\\' || p->s[1] != 'u' || hex4(p->s + 2, &lo) ||
                    lo < 0xDC00 || lo > 0xDFFF)
                    return fail(p, "lone surrogate escape");
                p->s += 6;
                cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
            }
            w += utf8_put(cp, w); // never longer than the escape it replaces
            break;
        }
        default:
            return fail(p, "bad escape");
        }
    }
    *w = 0; // w <= the closing quote
    *out = start;
    *out_len = (size_t)(w - start);
    p->s++;
    return 0;
}

static int parse_value(struct parser *p, struct jv *v);

static int parse_container(struct parser *p, struct jv *v, bool object) {
    if (++p->depth > MAX_DEPTH) return fail(p, "nesting too deep");
    v->type = object ? JV_OBJECT : JV_ARRAY;
    p->s++;
    skip_ws(p);
    char close = object ? '}' : ']';
    if (p->s < p->end && *p->s == close) {
        p->s++;
        p->depth--;
        return 0;
    }
    struct jv *last = NULL;
    for (;;) {
        struct jv *c = new_value(p);
        skip_ws(p);
        if (object) {
            if (p->s >= p->end || *p->s != '"') return fail(p, "expected a member name");
            p->s++;
            char *k;
            if (parse_string(p, &k, &c->key_len)) return -1;
            c->key = k;
            skip_ws(p);
            if (p->s >= p->end || *p->s != ':') return fail(p, "expected ':'");
            p->s++;
        }
        if (parse_value(p, c)) return -1;
        if (last)
            last->next = c;
        else
            v->child = c;
        last = c;
        v->n++;
        skip_ws(p);
        if (p->s < p->end && *p->s == ',') {
            p->s++;
            continue;
        }
        if (p->s < p->end && *p->s == close) {
            p->s++;
            p->depth--;
            return 0;
        }
        return fail(p, object ? "expected ',' or '}'" : "expected ',' or ']'");
    }
}

static int literal(struct parser *p, const char *word, struct jv *v, enum jv_type t) {
    size_t n = strlen(word);
    if ((size_t)(p->end - p->s) < n || memcmp(p->s, word, n)) return fail(p, "unexpected token");
    p->s += n;
    v->type = t;
    return 0;
}

static int parse_number(struct parser *p, struct jv *v) {
    // JSON grammar: -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?
    char *s = p->s;
    if (s < p->end && *s == '-') s++;
    if (s >= p->end || *s < '0' || *s > '9') return fail(p, "bad number");
    if (*s == '0')
        s++;
    else
        while (s < p->end && *s >= '0' && *s <= '9') s++;
    if (s < p->end && *s == '.') {
        s++;
        if (s >= p->end || *s < '0' || *s > '9') return fail(p, "bad number");
        while (s < p->end && *s >= '0' && *s <= '9') s++;
    }
    if (s < p->end && (*s == 'e' || *s == 'E')) {
        s++;
        if (s < p->end && (*s == '+' || *s == '-')) s++;
        if (s >= p->end || *s < '0' || *s > '9') return fail(p, "bad number");
        while (s < p->end && *s >= '0' && *s <= '9') s++;
    }
    // Small non-negative integers (all token ids) without strtod.
    double x = 0;
    bool simple = s - p->s <= 9;
    for (char *q = p->s; simple && q < s; q++) {
        if (*q < '0' || *q > '9')
            simple = false;
        else
            x = x * 10 + (*q - '0');
    }
    if (!simple) {
        char buf[64];
        size_t n = (size_t)(s - p->s);
        if (n >= sizeof buf) n = sizeof buf - 1;
        memcpy(buf, p->s, n);
        buf[n] = 0;
        x = strtod(buf, NULL);
    }
    v->type = JV_NUMBER;
    v->num = x;
    p->s = s;
    return 0;
}

static int parse_value(struct parser *p, struct jv *v) {
    skip_ws(p);
    if (p->s >= p->end) return fail(p, "unexpected end");
    switch (*p->s) {
    case '{':
        return parse_container(p, v, true);
    case '[':
        return parse_container(p, v, false);
    case '"':
        p->s++;
        v->type = JV_STRING;
        return parse_string(p, &v->str, &v->len);
    case 't':
        return literal(p, "true", v, JV_TRUE);
    case 'f':
        return literal(p, "false", v, JV_FALSE);
    case 'n':
        return literal(p, "null", v, JV_NULL);
    default:
        return parse_number(p, v);
    }
}

struct jv *jv_parse(char *text, size_t len, struct jv_doc **doc, struct wren_err *e) {
    *doc = xcalloc(1, sizeof **doc);
    size_t valid = utf8_valid_prefix(text, len);
    if (valid != len) {
        wren_errf(e, "not valid JSON: invalid UTF-8 at byte %zu", valid);
        return NULL;
    }
    struct parser p = {.s = text, .end = text + len, .base = text, .doc = *doc, .e = e};
    struct jv *root = new_value(&p);
    if (parse_value(&p, root)) return NULL;
    skip_ws(&p);
    if (p.s != p.end) {
        fail(&p, "trailing characters");
        return NULL;
    }
    return root;
}

void jv_free(struct jv_doc *doc) {
    if (!doc) return;
    for (struct jv_block *b = doc->last, *prev; b; b = prev) {
        prev = b->prev;
        free(b);
    }
    free(doc);
}

const struct jv *jv_get(const struct jv *o, const char *key) {
    if (!jv_is(o, JV_OBJECT)) return NULL;
    size_t n = strlen(key);
    for (const struct jv *c = o->child; c; c = c->next)
        if (c->key_len == n && !memcmp(c->key, key, n)) return c;
    return NULL;
}

int jv_get_bool(const struct jv *o, const char *key, bool dflt, bool *out, struct wren_err *e) {
    const struct jv *v = jv_get(o, key);
    if (!v || jv_is(v, JV_NULL)) {
        *out = dflt;
        return 0;
    }
    if (!(jv_is(v, JV_TRUE) || jv_is(v, JV_FALSE)))
        return wren_errf(e, "\"%s\" must be true or false", key);
    *out = jv_is(v, JV_TRUE);
    return 0;
}

const char *jv_type(const struct jv *o) {
    const struct jv *ty = jv_get(o, "type");
    return jv_is(ty, JV_STRING) ? ty->str : NULL;
}

bool jv_str_is(const struct jv *o, const char *key, const char *want) {
    const struct jv *v = jv_get(o, key);
    return jv_is(v, JV_STRING) && !strcmp(v->str, want);
}
