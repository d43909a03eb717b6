// Small helpers shared by every part of wren: checked allocation, time, bf16, file reading.
#pragma once
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "util/err.h"

// Allocation that never returns NULL: out of host memory is fatal (message + exit(1)).
void *xmalloc(size_t n);
void *xcalloc(size_t n, size_t size);
void *xrealloc(void *p, size_t n);
char *xstrdup(const char *s);
// 64-byte aligned allocation (for SIMD); free with free().
void *xaligned(size_t n);

double now_sec(void); // monotonic clock, seconds

// Reads a whole file into a NUL-terminated buffer. Returns NULL and fills e on failure.
char *read_file(const char *path, size_t *len, struct wren_err *e);

static inline float bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static inline uint16_t f32_to_bf16(float f) { // round to nearest even; NaN stays NaN
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1);
    return (uint16_t)(u >> 16);
}

static inline float f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h >> 15) << 31, exp = (h >> 10) & 0x1f, man = h & 0x3ff, u;
    if (exp == 0x1f)
        u = sign | 0x7f800000u | (man << 13);
    else if (exp)
        u = sign | ((exp + 112) << 23) | (man << 13);
    else if (!man)
        u = sign;
    else { // subnormal: normalise
        exp = 113;
        while (!(man & 0x400)) man <<= 1, exp--;
        u = sign | (exp << 23) | ((man & 0x3ff) << 13);
    }
    float f;
    memcpy(&f, &u, 4);
    return f;
}

// True when stderr is a terminal: progress output is shown only then.
int progress_enabled(void);
// Prints "\r<label> <done>/<total>" on a terminal, nothing otherwise; done == total ends the line.
void progress(const char *label, size_t done, size_t total);
