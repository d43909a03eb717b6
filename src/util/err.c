#include "util/err.h"

#include <stdio.h>
#include <string.h>

int wren_errf(struct wren_err *e, const char *fmt, ...) {
    if (!e) return -1;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->msg, sizeof e->msg, fmt, ap);
    va_end(ap);
    return -1;
}

int wren_err_prefix(struct wren_err *e, const char *fmt, ...) {
    if (!e) return -1;
    char prefix[512], old[sizeof e->msg];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    memcpy(old, e->msg, sizeof old);
    size_t n = strlen(prefix);
    if (n >= sizeof e->msg) n = sizeof e->msg - 1;
    memcpy(e->msg, prefix, n);
    size_t m = strnlen(old, sizeof old - 1);
    if (m > sizeof e->msg - 1 - n) m = sizeof e->msg - 1 - n;
    memcpy(e->msg + n, old, m);
    e->msg[n + m] = 0;
    return -1;
}
