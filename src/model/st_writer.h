// Writing safetensors files: the header (8-byte little-endian length, JSON with dtype, shape and
// data_offsets of each tensor, "__metadata__" {"format": "mlx"} as MLX writes it, padded with
// spaces to a multiple of 8) and checked positional writes of the data that follows it. Tensors
// are laid out contiguously in the order given, which is also their order in the header.
#pragma once
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "model/safetensors.h"
#include "util/err.h"

struct st_tensor_out {
    const char *name;
    enum st_dtype dtype;
    int ndim;
    int64_t shape[ST_MAX_DIMS];
    size_t nbytes; // filled by st_header_build (product of shape * dtype size)
    size_t offset; // filled by st_header_build: absolute byte offset of the data in the file
};

size_t st_tensor_elems(const struct st_tensor_out *t);

// Builds the complete header (length prefix + JSON + padding) for tensors t[0..n) and fills each
// tensor's nbytes and absolute file offset. Returns a malloc'd buffer of *len bytes, or NULL
// with e filled (bad shape, name unsuitable for JSON). *data_bytes is the sum of all nbytes.
char *st_header_build(struct st_tensor_out *t, int n, size_t *len, size_t *data_bytes,
                      struct wren_err *e);

// Writes all n bytes at offset off of fd (retrying short writes); every failure, including a
// full disk, becomes an error naming path.
int st_pwrite_all(int fd, const void *buf, size_t n, off_t off, const char *path,
                  struct wren_err *e);
