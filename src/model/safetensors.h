// Read-only safetensors files: mmap, header parse, bounds-checked tensor views.
#pragma once
#include <stddef.h>
#include <stdint.h>

#include "util/err.h"

enum st_dtype { ST_BF16, ST_F16, ST_F32, ST_U32, ST_I32, ST_U8, ST_I64, ST_F64, ST_BOOL, ST_OTHER };

#define ST_MAX_DIMS 8

struct st_tensor {
    const char *name;
    enum st_dtype dtype;
    char dtype_name[16];
    int ndim;
    int64_t shape[ST_MAX_DIMS];
    const uint8_t *data; // inside the mapping; [data, data + nbytes) is checked to be in the file
    size_t nbytes;
    int used; // set by the binder: every tensor must be used or deliberately skipped
};

struct st_file {
    char *path;
    void *map;
    size_t size;
    int n;
    struct st_tensor *tensors; // sorted by name
};

// Maps and parses one file; every tensor's byte range and dtype*shape size are validated.
struct st_file *st_open(const char *path, struct wren_err *e);
void st_close(struct st_file *f);
struct st_tensor *st_find(struct st_file *f, const char *name);
size_t st_dtype_size(enum st_dtype t);      // 0 for unknown
const char *st_dtype_name(enum st_dtype t); // "BF16", "U32", ...; "?" for unknown
