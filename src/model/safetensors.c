#include "model/safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "util/util.h"

static const struct {
    const char *name;
    enum st_dtype t;
    size_t size;
} dtypes[] = {
    {"BF16", ST_BF16, 2}, {"F16", ST_F16, 2}, {"F32", ST_F32, 4},
    {"U32", ST_U32, 4},   {"I32", ST_I32, 4}, {"U8", ST_U8, 1},
    {"I64", ST_I64, 8},   {"F64", ST_F64, 8}, {"BOOL", ST_BOOL, 1},
};

size_t st_dtype_size(enum st_dtype t) {
    for (size_t i = 0; i < sizeof dtypes / sizeof dtypes[0]; i++)
        if (dtypes[i].t == t) return dtypes[i].size;
    return 0;
}

const char *st_dtype_name(enum st_dtype t) {
    for (size_t i = 0; i < sizeof dtypes / sizeof dtypes[0]; i++)
        if (dtypes[i].t == t) return dtypes[i].name;
    return "?";
}

static int cmp_tensor(const void *a, const void *b) {
    return strcmp(((const struct st_tensor *)a)->name, ((const struct st_tensor *)b)->name);
}

static int parse_tensor(struct st_file *f, const cJSON *item, struct st_tensor *t,
                        size_t data_start, struct wren_err *e) {
    const char *name = item->string;
    const cJSON *dt = cJSON_GetObjectItemCaseSensitive(item, "dtype");
    const cJSON *shape = cJSON_GetObjectItemCaseSensitive(item, "shape");
    const cJSON *offs = cJSON_GetObjectItemCaseSensitive(item, "data_offsets");
    if (!cJSON_IsObject(item) || !cJSON_IsString(dt) || !cJSON_IsArray(shape) ||
        !cJSON_IsArray(offs) || cJSON_GetArraySize(offs) != 2)
        return wren_errf(e, "%s: tensor '%s': header entry needs dtype, shape and data_offsets[2]",
                         f->path, name);
    t->name = xstrdup(name);
    snprintf(t->dtype_name, sizeof t->dtype_name, "%s", dt->valuestring);
    t->dtype = ST_OTHER;
    for (size_t i = 0; i < sizeof dtypes / sizeof dtypes[0]; i++)
        if (!strcmp(dt->valuestring, dtypes[i].name)) t->dtype = dtypes[i].t;
    t->ndim = cJSON_GetArraySize(shape);
    if (t->ndim > ST_MAX_DIMS)
        return wren_errf(e, "%s: tensor '%s' has %d dimensions (max %d)", f->path, name, t->ndim,
                         ST_MAX_DIMS);
    uint64_t count = 1;
    int d = 0;
    for (const cJSON *s = shape->child; s; s = s->next, d++) {
        if (!cJSON_IsNumber(s) || s->valuedouble < 0 || s->valuedouble > 9.0e15 ||
            s->valuedouble != (double)(int64_t)s->valuedouble)
            return wren_errf(e, "%s: tensor '%s': invalid shape", f->path, name);
        t->shape[d] = (int64_t)s->valuedouble;
        if (t->shape[d] && count > UINT64_MAX / (uint64_t)t->shape[d])
            return wren_errf(e, "%s: tensor '%s': shape overflows", f->path, name);
        count *= (uint64_t)t->shape[d];
    }
    double o0 = offs->child->valuedouble, o1 = offs->child->next->valuedouble;
    if (!cJSON_IsNumber(offs->child) || !cJSON_IsNumber(offs->child->next) || o0 < 0 || o1 < o0 ||
        o1 > (double)f->size)
        return wren_errf(e,
                         "%s: tensor '%s': data_offsets [%.0f, %.0f] invalid or past the end "
                         "of the file (%zu data bytes)",
                         f->path, name, o0, o1, f->size - data_start);
    size_t b0 = (size_t)o0, b1 = (size_t)o1;
    if (data_start + b1 > f->size)
        return wren_errf(e,
                         "%s: tensor '%s': data [%zu, %zu) runs past the end of the file "
                         "(%zu data bytes; file truncated?)",
                         f->path, name, b0, b1, f->size - data_start);
    size_t esz = st_dtype_size(t->dtype);
    if (esz && (count > SIZE_MAX / esz || count * esz != b1 - b0))
        return wren_errf(e, "%s: tensor '%s': %s shape needs %llu bytes but data_offsets span %zu",
                         f->path, name, t->dtype_name, (unsigned long long)(count * esz), b1 - b0);
    t->data = (const uint8_t *)f->map + data_start + b0;
    t->nbytes = b1 - b0;
    return 0;
}

struct st_file *st_open(const char *path, struct wren_err *e) {
    struct st_file *f = xcalloc(1, sizeof *f);
    f->path = xstrdup(path);
    cJSON *root = NULL;
    int fd = open(path, O_RDONLY);
    if (fd < 0) {
        wren_errf(e, "%s: %s", path, strerror(errno));
        goto fail;
    }
    struct stat sb;
    if (fstat(fd, &sb) < 0) {
        wren_errf(e, "%s: %s", path, strerror(errno));
        close(fd);
        goto fail;
    }
    f->size = (size_t)sb.st_size;
    if (f->size < 8) {
        wren_errf(e, "%s: too small for a safetensors file (%zu bytes)", path, f->size);
        close(fd);
        goto fail;
    }
    f->map = mmap(NULL, f->size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (f->map == MAP_FAILED) {
        f->map = NULL;
        wren_errf(e, "%s: mmap failed: %s", path, strerror(errno));
        goto fail;
    }
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = hlen << 8 | ((const uint8_t *)f->map)[i];
    if (hlen > f->size - 8 || hlen > (100u << 20)) {
        wren_errf(e,
                  "%s: header length %llu exceeds the file (%zu bytes): not a safetensors file "
                  "or truncated",
                  path, (unsigned long long)hlen, f->size);
        goto fail;
    }
    root = cJSON_ParseWithLength((const char *)f->map + 8, (size_t)hlen);
    if (!cJSON_IsObject(root)) {
        wren_errf(e, "%s: header is not a valid JSON object", path);
        goto fail;
    }
    int n = 0;
    for (cJSON *it = root->child; it; it = it->next) n += strcmp(it->string, "__metadata__") != 0;
    f->tensors = xcalloc((size_t)(n ? n : 1), sizeof *f->tensors);
    for (cJSON *it = root->child; it; it = it->next) {
        if (!strcmp(it->string, "__metadata__")) continue;
        if (parse_tensor(f, it, &f->tensors[f->n], 8 + (size_t)hlen, e)) {
            f->n++; // so st_close frees the name
            goto fail;
        }
        f->n++;
    }
    qsort(f->tensors, (size_t)f->n, sizeof *f->tensors, cmp_tensor);
    for (int i = 1; i < f->n; i++)
        if (!strcmp(f->tensors[i].name, f->tensors[i - 1].name)) {
            wren_errf(e, "%s: tensor '%s' appears twice", path, f->tensors[i].name);
            goto fail;
        }
    cJSON_Delete(root);
    return f;
fail:
    cJSON_Delete(root);
    st_close(f);
    return NULL;
}

void st_close(struct st_file *f) {
    if (!f) return;
    for (int i = 0; i < f->n; i++) free((char *)f->tensors[i].name);
    free(f->tensors);
    if (f->map) munmap(f->map, f->size);
    free(f->path);
    free(f);
}

struct st_tensor *st_find(struct st_file *f, const char *name) {
    struct st_tensor key = {.name = name};
    return bsearch(&key, f->tensors, (size_t)f->n, sizeof key, cmp_tensor);
}
