// A growable byte buffer for building text (always NUL-terminated, may hold NUL bytes).
#pragma once
#include <stddef.h>

struct strbuf {
    char *p; // NULL until the first append; then p[len] == 0
    size_t len, cap;
};

void sb_put(struct strbuf *sb, const char *s, size_t n);
void sb_puts(struct strbuf *sb, const char *s);
void sb_putc(struct strbuf *sb, char c);
void sb_printf(struct strbuf *sb, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
// Hands the text over (malloc'd, never NULL) and leaves sb empty.
char *sb_take(struct strbuf *sb);
void sb_free(struct strbuf *sb);
