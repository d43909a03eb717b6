#include "model/st_writer.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "util/strbuf.h"
#include "util/util.h"

size_t st_tensor_elems(const struct st_tensor_out *t) {
    size_t n = 1;
    for (int d = 0; d < t->ndim; d++) n *= (size_t)t->shape[d];
    return n;
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
    struct strbuf b = {0};
    sb_put(&b, "\0\0\0\0\0\0\0\0", 8); // the length, filled in below
    sb_printf(&b, "{\"__metadata__\":{\"format\":\"mlx\"}");
    size_t off = 0;
    for (int i = 0; i < n; i++) {
        if (!name_ok(t[i].name)) {
            sb_free(&b);
            wren_errf(e, "tensor name '%s' cannot be written into a safetensors header", t[i].name);
            return NULL;
        }
        if (t[i].ndim < 0 || t[i].ndim > ST_MAX_DIMS) {
            sb_free(&b);
            wren_errf(e, "tensor %s: %d dimensions (at most %d)", t[i].name, t[i].ndim,
                      ST_MAX_DIMS);
            return NULL;
        }
        sb_printf(&b, ",\"%s\":{\"dtype\":\"%s\",\"shape\":[", t[i].name,
                  st_dtype_name(t[i].dtype));
        for (int d = 0; d < t[i].ndim; d++) {
            if (t[i].shape[d] < 0) {
                sb_free(&b);
                wren_errf(e, "tensor %s: negative dimension", t[i].name);
                return NULL;
            }
            sb_printf(&b, "%s%lld", d ? "," : "", (long long)t[i].shape[d]);
        }
        if (!st_dtype_size(t[i].dtype)) {
            sb_free(&b);
            wren_errf(e, "tensor %s: dtype without a fixed size", t[i].name);
            return NULL;
        }
        t[i].nbytes = st_tensor_elems(&t[i]) * st_dtype_size(t[i].dtype);
        sb_printf(&b, "],\"data_offsets\":[%zu,%zu]}", off, off + t[i].nbytes);
        off += t[i].nbytes;
    }
    sb_printf(&b, "}");
    while ((b.len - 8) % 8) sb_putc(&b, ' ');
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
    return sb_take(&b);
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
