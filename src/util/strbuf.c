#include "util/strbuf.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/util.h"

static void sb_reserve(struct strbuf *sb, size_t extra) {
    if (sb->p && sb->len + extra < sb->cap) return;
    size_t cap = sb->cap ? sb->cap : 64;
    while (cap <= sb->len + extra) cap *= 2;
    sb->p = xrealloc(sb->p, cap);
    sb->cap = cap;
}

void sb_put(struct strbuf *sb, const char *s, size_t n) {
    sb_reserve(sb, n);
    if (n) memcpy(sb->p + sb->len, s, n);
    sb->len += n;
    sb->p[sb->len] = 0;
}

void sb_puts(struct strbuf *sb, const char *s) {
    sb_put(sb, s, strlen(s));
}

void sb_putc(struct strbuf *sb, char c) {
    sb_put(sb, &c, 1);
}

void sb_printf(struct strbuf *sb, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (n <= 0) return;
    sb_reserve(sb, (size_t)n);
    va_start(ap, fmt);
    vsnprintf(sb->p + sb->len, (size_t)n + 1, fmt, ap);
    va_end(ap);
    sb->len += (size_t)n;
}

char *sb_take(struct strbuf *sb) {
    if (!sb->p) sb_reserve(sb, 0), sb->p[0] = 0;
    char *p = sb->p;
    *sb = (struct strbuf){0};
    return p;
}

void sb_free(struct strbuf *sb) {
    free(sb->p);
    *sb = (struct strbuf){0};
}
