#include "util/pyjson.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>
#include <utf8proc.h>

#include "util/util.h"

enum { MAX_DEPTH = 512, MAX_INT_DIGITS = 4300 }; // 4300: Python's int(str) digit limit

struct parser {
    const unsigned char *s;
    size_t n, i;
    int flags, depth;
    struct wren_err *e;
};

static int fail(struct parser *p, const char *what) {
    return wren_errf(p->e, "invalid JSON at byte %zu: %s", p->i, what);
}

static void skip_ws(struct parser *p) {
    while (p->i < p->n &&
           (p->s[p->i] == ' ' || p->s[p->i] == '\t' || p->s[p->i] == '\n' || p->s[p->i] == '\r'))
        p->i++;
}

// Length of the valid UTF-8 character at s (n bytes available), 0 when invalid.
static size_t utf8_char_len(const unsigned char *s, size_t n) {
    unsigned c = s[0];
    if (c < 0x80) return 1;
    size_t len;
    unsigned lo = 0x80, hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF)
        len = 2;
    else if (c >= 0xE0 && c <= 0xEF) {
        len = 3;
        if (c == 0xE0) lo = 0xA0;
        if (c == 0xED) hi = 0x9F; // no UTF-16 surrogates
    } else if (c >= 0xF0 && c <= 0xF4) {
        len = 4;
        if (c == 0xF0) lo = 0x90;
        if (c == 0xF4) hi = 0x8F;
    } else
        return 0;
    if (n < len || s[1] < lo || s[1] > hi) return 0;
    for (size_t k = 2; k < len; k++)
        if ((s[k] & 0xC0) != 0x80) return 0;
    return len;
}

static void put_utf8(struct strbuf *sb, unsigned cp) {
    char b[4];
    if (cp < 0x80)
        b[0] = (char)cp, sb_put(sb, b, 1);
    else if (cp < 0x800) {
        b[0] = (char)(0xC0 | cp >> 6), b[1] = (char)(0x80 | (cp & 63));
        sb_put(sb, b, 2);
    } else if (cp < 0x10000) {
        b[0] = (char)(0xE0 | cp >> 12), b[1] = (char)(0x80 | (cp >> 6 & 63));
        b[2] = (char)(0x80 | (cp & 63));
        sb_put(sb, b, 3);
    } else {
        b[0] = (char)(0xF0 | cp >> 18), b[1] = (char)(0x80 | (cp >> 12 & 63));
        b[2] = (char)(0x80 | (cp >> 6 & 63)), b[3] = (char)(0x80 | (cp & 63));
        sb_put(sb, b, 4);
    }
}

static int hex4(struct parser *p, unsigned *out) {
    if (p->n - p->i < 4) return fail(p, "truncated \\u escape");
    unsigned v = 0;
    for (int k = 0; k < 4; k++) {
        unsigned c = p->s[p->i + (size_t)k], d;
        if (c >= '0' && c <= '9')
            d = c - '0';
        else if (c >= 'a' && c <= 'f')
            d = c - 'a' + 10;
        else if (c >= 'A' && c <= 'F')
            d = c - 'A' + 10;
        else
            return fail(p, "bad \\u escape");
        v = v * 16 + d;
    }
    p->i += 4;
    *out = v;
    return 0;
}

// Parses the string starting at the opening quote into a malloc'd NUL-terminated buffer.
static char *parse_string(struct parser *p) {
    struct strbuf sb = {0};
    p->i++; // opening quote
    for (;;) {
        if (p->i >= p->n) {
            fail(p, "unterminated string");
            goto bad;
        }
        unsigned c = p->s[p->i];
        if (c == '"') {
            p->i++;
            return sb_take(&sb);
        }
        if (c < 0x20) {
            fail(p, "control character in string");
            goto bad;
        }
        if (c != '\\') {
            size_t len = utf8_char_len(p->s + p->i, p->n - p->i);
            if (!len) {
                fail(p, "invalid UTF-8");
                goto bad;
            }
            sb_put(&sb, (const char *)p->s + p->i, len);
            p->i += len;
            continue;
        }
        if (++p->i >= p->n) {
            fail(p, "unterminated string");
            goto bad;
        }
        c = p->s[p->i++];
        const char *simple = strchr("\"\\/bfnrt", (int)c);
        if (c && simple) {
            static const char out[] = "\"\\/\b\f\n\r\t";
            sb_putc(&sb, out[simple - "\"\\/bfnrt"]);
            continue;
        }
        if (c != 'u') {
            fail(p, "bad escape");
            goto bad;
        }
        unsigned cp, lo;
        if (hex4(p, &cp)) goto bad;
        if (cp >= 0xD800 && cp < 0xDC00) {
            if (p->n - p->i < 6 || p->s[p->i] != '\\' || p->s[p->i + 1] != 'u') {
                fail(p, "lone UTF-16 surrogate");
                goto bad;
            }
            p->i += 2;
            if (hex4(p, &lo)) goto bad;
            if (lo < 0xDC00 || lo > 0xDFFF) {
                fail(p, "lone UTF-16 surrogate");
                goto bad;
            }
            cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
        } else if (cp >= 0xDC00 && cp < 0xE000) {
            fail(p, "lone UTF-16 surrogate");
            goto bad;
        }
        if (cp == 0) {
            fail(p, "\\u0000 in strings is not supported");
            goto bad;
        }
        put_utf8(&sb, cp);
    }
bad:
    sb_free(&sb);
    return NULL;
}

static cJSON *number_node(const char *text, size_t len, double d) {
    cJSON *v = cJSON_CreateNumber(isfinite(d) ? d : 0);
    if (!v) return NULL;
    v->valuedouble = d;
    v->valuestring = xmalloc(len + 1);
    memcpy(v->valuestring, text, len);
    v->valuestring[len] = 0;
    return v;
}

static bool match(struct parser *p, const char *word) {
    size_t k = strlen(word);
    if (p->n - p->i < k || memcmp(p->s + p->i, word, k)) return false;
    p->i += k;
    return true;
}

static cJSON *parse_number(struct parser *p) {
    size_t start = p->i;
    const unsigned char *s = p->s;
    if (p->flags & PYJSON_NONFINITE) {
        if (match(p, "NaN")) return number_node("NaN", 3, NAN);
        if (match(p, "Infinity")) return number_node("Infinity", 8, INFINITY);
        if (match(p, "-Infinity")) return number_node("-Infinity", 9, -INFINITY);
    }
    if (p->i < p->n && s[p->i] == '-') p->i++;
    if (p->i >= p->n || s[p->i] < '0' || s[p->i] > '9') {
        fail(p, "unexpected character");
        return NULL;
    }
    if (s[p->i] == '0')
        p->i++;
    else
        while (p->i < p->n && s[p->i] >= '0' && s[p->i] <= '9') p->i++;
    size_t int_end = p->i;
    if (p->i + 1 < p->n && s[p->i] == '.' && s[p->i + 1] >= '0' && s[p->i + 1] <= '9') {
        p->i++;
        while (p->i < p->n && s[p->i] >= '0' && s[p->i] <= '9') p->i++;
    }
    if (p->i < p->n && (s[p->i] == 'e' || s[p->i] == 'E')) {
        size_t k = p->i + 1;
        if (k < p->n && (s[k] == '+' || s[k] == '-')) k++;
        if (k < p->n && s[k] >= '0' && s[k] <= '9') {
            while (k < p->n && s[k] >= '0' && s[k] <= '9') k++;
            p->i = k;
        }
    }
    size_t len = p->i - start;
    if (int_end == p->i && len > MAX_INT_DIGITS) {
        fail(p, "integer with too many digits");
        return NULL;
    }
    char small[64], *buf = len < sizeof small ? small : xmalloc(len + 1);
    memcpy(buf, s + start, len);
    buf[len] = 0;
    cJSON *v = number_node(buf, len, strtod(buf, NULL));
    if (buf != small) free(buf);
    return v;
}

static cJSON *parse_value(struct parser *p);

static cJSON *parse_array(struct parser *p) {
    cJSON *arr = cJSON_CreateArray();
    p->i++;
    skip_ws(p);
    if (p->i < p->n && p->s[p->i] == ']') {
        p->i++;
        return arr;
    }
    for (;;) {
        cJSON *v = parse_value(p);
        if (!v) goto bad;
        cJSON_AddItemToArray(arr, v);
        skip_ws(p);
        if (p->i < p->n && p->s[p->i] == ',') {
            p->i++;
            continue;
        }
        if (p->i < p->n && p->s[p->i] == ']') {
            p->i++;
            return arr;
        }
        fail(p, "expected ',' or ']'");
        goto bad;
    }
bad:
    cJSON_Delete(arr);
    return NULL;
}

struct keyed {
    const char *key;
    size_t pos;
    cJSON *item;
};

static int by_key_then_pos(const void *a, const void *b) {
    const struct keyed *x = a, *y = b;
    int c = strcmp(x->key, y->key);
    return c ? c : (x->pos > y->pos) - (x->pos < y->pos);
}

// Sorting finds repeats in O(n log n): a request with many keys must not take quadratic time.
void pyjson_dedupe_keys(cJSON *obj) {
    size_t n = 0;
    for (cJSON *it = obj ? obj->child : NULL; it; it = it->next) n++;
    if (n < 2) return;
    struct keyed *k = xmalloc(n * sizeof *k);
    n = 0;
    for (cJSON *it = obj->child; it; it = it->next, n++)
        k[n] = (struct keyed){it->string ? it->string : "", n, it};
    qsort(k, n, sizeof *k, by_key_then_pos);
    for (size_t s = 0, t; s < n; s = t) {
        for (t = s + 1; t < n && !strcmp(k[t].key, k[s].key);) t++;
        if (t - s < 2) continue;
        for (size_t j = s + 1; j + 1 < t; j++)
            cJSON_Delete(cJSON_DetachItemViaPointer(obj, k[j].item));
        cJSON *last = cJSON_DetachItemViaPointer(obj, k[t - 1].item);
        cJSON_ReplaceItemViaPointer(obj, k[s].item, last); // frees the first one
    }
    free(k);
}

static cJSON *parse_object(struct parser *p) {
    cJSON *obj = cJSON_CreateObject();
    p->i++;
    skip_ws(p);
    if (p->i < p->n && p->s[p->i] == '}') {
        p->i++;
        return obj;
    }
    for (;;) {
        skip_ws(p);
        if (p->i >= p->n || p->s[p->i] != '"') {
            fail(p, "expected a string key");
            goto bad;
        }
        char *key = parse_string(p);
        if (!key) goto bad;
        skip_ws(p);
        if (p->i >= p->n || p->s[p->i] != ':') {
            free(key);
            fail(p, "expected ':'");
            goto bad;
        }
        p->i++;
        cJSON *v = parse_value(p);
        if (!v) {
            free(key);
            goto bad;
        }
        cJSON_AddItemToObject(obj, key, v);
        free(key);
        skip_ws(p);
        if (p->i < p->n && p->s[p->i] == ',') {
            p->i++;
            continue;
        }
        if (p->i < p->n && p->s[p->i] == '}') {
            p->i++;
            pyjson_dedupe_keys(obj);
            return obj;
        }
        fail(p, "expected ',' or '}'");
        goto bad;
    }
bad:
    cJSON_Delete(obj);
    return NULL;
}

static cJSON *parse_value(struct parser *p) {
    skip_ws(p);
    if (p->i >= p->n) {
        fail(p, "unexpected end of input");
        return NULL;
    }
    if (++p->depth > MAX_DEPTH) {
        fail(p, "nesting too deep");
        return NULL;
    }
    cJSON *v = NULL;
    unsigned c = p->s[p->i];
    if (c == '{')
        v = parse_object(p);
    else if (c == '[')
        v = parse_array(p);
    else if (c == '"') {
        char *s = parse_string(p);
        if (s) {
            v = cJSON_CreateString("");
            free(v->valuestring);
            v->valuestring = s;
        }
    } else if (match(p, "true"))
        v = cJSON_CreateTrue();
    else if (match(p, "false"))
        v = cJSON_CreateFalse();
    else if (match(p, "null"))
        v = cJSON_CreateNull();
    else
        v = parse_number(p);
    p->depth--;
    return v;
}

cJSON *pyjson_parse(const char *text, size_t len, int flags, struct wren_err *e) {
    struct parser p = {(const unsigned char *)text, len, 0, flags, 0, e};
    cJSON *v = parse_value(&p);
    if (!v) return NULL;
    skip_ws(&p);
    if (p.i != p.n) {
        cJSON_Delete(v);
        fail(&p, "extra data after the value");
        return NULL;
    }
    return v;
}

char *utf8_valid_copy(const char *s, size_t n) {
    const char *nul = memchr(s, 0, n);
    if (nul) n = (size_t)(nul - s);
    struct strbuf sb = {0};
    for (size_t i = 0; i < n;) {
        size_t k = utf8_char_len((const unsigned char *)s + i, n - i);
        if (k)
            sb_put(&sb, s + i, k), i += k;
        else
            sb_puts(&sb, "\xEF\xBF\xBD"), i++;
    }
    return sb_take(&sb);
}

// ---- writing ----

// The shortest decimal digits that read back as |d| (the nearest such when several), as an
// integer string and the decimal point position: |d| = 0.digits * 10^decpt. Like David Gay's
// dtoa mode 0, which Python's repr uses.
static int shortest_digits(double d, char digits[24], int *decpt) {
    char buf[48];
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(buf, sizeof buf, "%.*e", prec - 1, fabs(d));
        if (strtod(buf, NULL) == fabs(d)) break;
        // The correctly rounded candidate misses, but at a power of two the interval that reads
        // back is lopsided and a neighbour one unit away may still hit.
        char *e = strchr(buf, 'e');
        int exp10 = atoi(e + 1) - (prec - 1);
        unsigned long long m = 0;
        for (char *c = buf; c < e; c++)
            if (*c != '.') m = m * 10 + (unsigned long long)(*c - '0');
        char alt[48];
        for (int k = -1; k <= 1; k += 2) {
            snprintf(alt, sizeof alt, "%llue%d", m + (unsigned long long)k, exp10);
            if (strtod(alt, NULL) == fabs(d)) {
                e = strchr(alt, 'e');
                int n = (int)(e - alt);
                memcpy(digits, alt, (size_t)n);
                *decpt = exp10 + n;
                return n;
            }
        }
    }
    int n = 0;
    const char *s = buf;
    for (; *s && *s != 'e'; s++)
        if (*s != '.') digits[n++] = *s;
    *decpt = atoi(s + 1) + 1;
    return n;
}

void py_float_repr(struct strbuf *sb, double d) {
    if (d == 0) {
        sb_puts(sb, signbit(d) ? "-0.0" : "0.0");
        return;
    }
    if (d < 0) sb_putc(sb, '-');
    char digits[24];
    int decpt, nd = shortest_digits(d, digits, &decpt);
    while (nd > 1 && digits[nd - 1] == '0') nd--;
    if (decpt <= -4 || decpt > 16) {
        sb_putc(sb, digits[0]);
        if (nd > 1) sb_putc(sb, '.'), sb_put(sb, digits + 1, (size_t)nd - 1);
        int x = decpt - 1;
        sb_printf(sb, "e%c%02d", x < 0 ? '-' : '+', x < 0 ? -x : x);
    } else if (decpt <= 0) {
        sb_puts(sb, "0.");
        for (int k = 0; k < -decpt; k++) sb_putc(sb, '0');
        sb_put(sb, digits, (size_t)nd);
    } else if (decpt < nd) {
        sb_put(sb, digits, (size_t)decpt);
        sb_putc(sb, '.');
        sb_put(sb, digits + decpt, (size_t)(nd - decpt));
    } else {
        sb_put(sb, digits, (size_t)nd);
        for (int k = nd; k < decpt; k++) sb_putc(sb, '0');
        sb_puts(sb, ".0");
    }
}

enum style { STYLE_JSON, STYLE_VERBATIM, STYLE_REPR };

static void put_number(struct strbuf *sb, const cJSON *v, enum style st) {
    const char *t = v->valuestring;
    double d = v->valuedouble;
    if (t && st == STYLE_VERBATIM) {
        sb_puts(sb, t);
        return;
    }
    bool is_int;
    if (t)
        is_int = !strpbrk(t, ".eEIN");
    else
        is_int = isfinite(d) && d == floor(d) && fabs(d) < 9007199254740992.0;
    if (is_int) {
        if (!t)
            sb_printf(sb, "%.0f", d == 0 ? 0.0 : d);
        else if (d == 0)
            sb_putc(sb, '0'); // int("-0") is 0
        else
            sb_puts(sb, t);
    } else if (isnan(d))
        sb_puts(sb, st == STYLE_REPR ? "nan" : "NaN");
    else if (isinf(d))
        sb_puts(sb,
                st == STYLE_REPR ? (d < 0 ? "-inf" : "inf") : (d < 0 ? "-Infinity" : "Infinity"));
    else
        py_float_repr(sb, d);
}

static void put_json_string(struct strbuf *sb, const char *s) {
    sb_putc(sb, '"');
    for (const unsigned char *c = (const unsigned char *)s; *c; c++) {
        switch (*c) {
        case '"':
            sb_puts(sb, "\\\"");
            break;
        case '\\':
            sb_puts(sb, "\\\\");
            break;
        case '\n':
            sb_puts(sb, "\\n");
            break;
        case '\r':
            sb_puts(sb, "\\r");
            break;
        case '\t':
            sb_puts(sb, "\\t");
            break;
        case '\b':
            sb_puts(sb, "\\b");
            break;
        case '\f':
            sb_puts(sb, "\\f");
            break;
        default:
            if (*c < 0x20)
                sb_printf(sb, "\\u%04x", *c);
            else
                sb_putc(sb, (char)*c);
        }
    }
    sb_putc(sb, '"');
}

static bool py_printable(utf8proc_int32_t cp) {
    switch (utf8proc_category(cp)) {
    case UTF8PROC_CATEGORY_CN:
    case UTF8PROC_CATEGORY_CC:
    case UTF8PROC_CATEGORY_CF:
    case UTF8PROC_CATEGORY_CS:
    case UTF8PROC_CATEGORY_CO:
    case UTF8PROC_CATEGORY_ZL:
    case UTF8PROC_CATEGORY_ZP:
    case UTF8PROC_CATEGORY_ZS:
        return cp == ' ';
    default:
        return true;
    }
}

// Python's repr() of a str.
static void put_repr_string(struct strbuf *sb, const char *s) {
    char q = strchr(s, '\'') && !strchr(s, '"') ? '"' : '\'';
    sb_putc(sb, q);
    const utf8proc_uint8_t *u = (const utf8proc_uint8_t *)s;
    utf8proc_ssize_t n = (utf8proc_ssize_t)strlen(s);
    while (n > 0) {
        utf8proc_int32_t cp;
        utf8proc_ssize_t k = utf8proc_iterate(u, n, &cp);
        if (k <= 0) { // not UTF-8 (cannot come from pyjson_parse): show the byte
            sb_printf(sb, "\\x%02x", *u);
            u++, n--;
            continue;
        }
        if (cp == q || cp == '\\')
            sb_putc(sb, '\\'), sb_putc(sb, (char)cp);
        else if (cp == '\t')
            sb_puts(sb, "\\t");
        else if (cp == '\n')
            sb_puts(sb, "\\n");
        else if (cp == '\r')
            sb_puts(sb, "\\r");
        else if (cp < 0x20 || cp == 0x7f)
            sb_printf(sb, "\\x%02x", (unsigned)cp);
        else if (cp < 0x7f || py_printable(cp))
            sb_put(sb, (const char *)u, (size_t)k);
        else if (cp <= 0xff)
            sb_printf(sb, "\\x%02x", (unsigned)cp);
        else if (cp <= 0xffff)
            sb_printf(sb, "\\u%04x", (unsigned)cp);
        else
            sb_printf(sb, "\\U%08x", (unsigned)cp);
        u += k, n -= k;
    }
    sb_putc(sb, q);
}

static void put_value(struct strbuf *sb, const cJSON *v, enum style st) {
    if (!v) return;
    if (cJSON_IsString(v)) {
        if (st == STYLE_REPR)
            put_repr_string(sb, v->valuestring);
        else
            put_json_string(sb, v->valuestring);
    } else if (cJSON_IsNumber(v))
        put_number(sb, v, st);
    else if (cJSON_IsBool(v))
        sb_puts(sb, st == STYLE_REPR ? (cJSON_IsTrue(v) ? "True" : "False")
                                     : (cJSON_IsTrue(v) ? "true" : "false"));
    else if (cJSON_IsNull(v))
        sb_puts(sb, st == STYLE_REPR ? "None" : "null");
    else if (cJSON_IsArray(v) || cJSON_IsObject(v)) {
        bool obj = cJSON_IsObject(v);
        sb_putc(sb, obj ? '{' : '[');
        for (const cJSON *it = v->child; it; it = it->next) {
            if (it != v->child) sb_puts(sb, ", ");
            if (obj) {
                if (st == STYLE_REPR)
                    put_repr_string(sb, it->string ? it->string : "");
                else
                    put_json_string(sb, it->string ? it->string : "");
                sb_puts(sb, ": ");
            }
            put_value(sb, it, st);
        }
        sb_putc(sb, obj ? '}' : ']');
    } else if (cJSON_IsRaw(v) && v->valuestring)
        sb_puts(sb, v->valuestring);
}

void pyjson_dump(struct strbuf *sb, const cJSON *v) {
    put_value(sb, v, STYLE_JSON);
}
void pyjson_dump_verbatim(struct strbuf *sb, const cJSON *v) {
    put_value(sb, v, STYLE_VERBATIM);
}

void pyjson_str(struct strbuf *sb, const cJSON *v) {
    if (cJSON_IsString(v))
        sb_puts(sb, v->valuestring);
    else
        put_value(sb, v, STYLE_REPR);
}

bool py_truthy(const cJSON *v) {
    if (!v || cJSON_IsNull(v) || cJSON_IsFalse(v)) return false;
    if (cJSON_IsNumber(v)) return v->valuedouble != 0;
    if (cJSON_IsString(v)) return v->valuestring && v->valuestring[0];
    if (cJSON_IsArray(v) || cJSON_IsObject(v)) return v->child != NULL;
    return true;
}

cJSON *pyjson_get(const cJSON *o, const char *key) {
    if (!cJSON_IsObject(o)) return NULL;
    cJSON *found = NULL;
    for (cJSON *it = o->child; it; it = it->next)
        if (it->string && !strcmp(it->string, key)) found = it;
    return found;
}
