#include "model/st_writer.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "util/util.h"

const char *st_dtype_name(enum st_dtype t) {
    switch (t) {
    case ST_U32:
        return "U32";
    case ST_BF16:
        return "BF16";
    case ST_F32:
        return "F32";
    }
    return "?";
}

size_t st_dtype_size(enum st_dtype t) {
    return t == ST_BF16 ? 2 : 4;
}

size_t st_tensor_elems(const struct st_tensor_out *t) {
    size_t n = 1;
    for (int d = 0; d < t->ndim; d++) n *= (size_t)t->shape[d];
    return n;
}

struct strbuf {
    char *p;
    size_t len, cap;
};

static void sb_printf(struct strbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void sb_printf(struct strbuf *b, const char *fmt, ...) {
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(b->p + b->len, b->cap - b->len, fmt, ap);
        va_end(ap);
        if (n >= 0 && (size_t)n < b->cap - b->len) {
            b->len += (size_t)n;
            return;
        }
        b->cap = b->cap * 2 + (n > 0 ? (size_t)n : 0);
        b->p = xrealloc(b->p, b->cap);
    }
}

// Names go into the JSON verbatim, so they must need no escaping.
static int name_ok(const char *s) {
    if (!*s) return 0;
    for (; *s; s++)
        if (*s < 0x20 || *s > 0x7e || *s == '"' || *s == '\\') return 0;
    return 1;
}

char *st_header_build(struct st_tensor_out *t, int n, size_t *len, size_t *data_bytes,
                      struct wren_err *e) {
    struct strbuf b = {xmalloc(4096), 8, 4096}; // the first 8 bytes hold the length
    sb_printf(&b, "{\"__metadata__\":{\"format\":\"mlx\"}");
    size_t off = 0;
    for (int i = 0; i < n; i++) {
        if (!name_ok(t[i].name)) {
            free(b.p);
            wren_errf(e, "tensor name '%s' cannot be written into a safetensors header", t[i].name);
            return NULL;
        }
        if (t[i].ndim < 0 || t[i].ndim > ST_MAX_DIMS) {
            free(b.p);
            wren_errf(e, "tensor %s: %d dimensions (at most %d)", t[i].name, t[i].ndim,
                      ST_MAX_DIMS);
            return NULL;
        }
        sb_printf(&b, ",\"%s\":{\"dtype\":\"%s\",\"shape\":[", t[i].name,
                  st_dtype_name(t[i].dtype));
        for (int d = 0; d < t[i].ndim; d++) {
            if (t[i].shape[d] < 0) {
                free(b.p);
                wren_errf(e, "tensor %s: negative dimension", t[i].name);
                return NULL;
            }
            sb_printf(&b, "%s%lld", d ? "," : "", (long long)t[i].shape[d]);
        }
        t[i].nbytes = st_tensor_elems(&t[i]) * st_dtype_size(t[i].dtype);
        sb_printf(&b, "],\"data_offsets\":[%zu,%zu]}", off, off + t[i].nbytes);
        off += t[i].nbytes;
    }
    sb_printf(&b, "}");
    while ((b.len - 8) % 8) sb_printf(&b, " ");
    uint64_t hlen = b.len - 8;
    for (int k = 0; k < 8; k++) b.p[k] = (char)(uint8_t)(hlen >> (8 * k)); // little-endian
    // data_offsets in the header are relative to the data start; the offsets kept are absolute
    size_t at = b.len;
    for (int i = 0; i < n; i++) {
        t[i].offset = at;
        at += t[i].nbytes;
    }
    *len = b.len;
    *data_bytes = off;
    return b.p;
}

int st_pwrite_all(int fd, const void *buf, size_t n, off_t off, const char *path,
                  struct wren_err *e) {
    const char *p = buf;
    while (n) {
        ssize_t w = pwrite(fd, p, n, off);
        if (w < 0 && errno == EINTR) continue;
        if (w < 0) return wren_errf(e, "writing %s: %s", path, strerror(errno));
        if (w == 0) return wren_errf(e, "writing %s: no progress (disk full?)", path);
        p += w;
        n -= (size_t)w;
        off += w;
    }
    return 0;
}
