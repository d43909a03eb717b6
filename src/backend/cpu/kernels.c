// Dense and quantized matrix products for the CPU backend. A weight row is unpacked once into f32
// (the raw quantized levels for MLX affine weights) and reused for every activation row; the affine
// scale and bias are applied per group: sum_j (s*q_j + b) x_j = s * sum_j q_j x_j + b * sum_j x_j.
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu.h"
#include "util/util.h"

typedef float v8f __attribute__((vector_size(32)));

float dot_f32(const float *a, const float *b, int n) {
    v8f acc0 = {0}, acc1 = {0};
    int j = 0;
    for (; j + 16 <= n; j += 16) {
        v8f a0, a1, b0, b1;
        memcpy(&a0, a + j, 32);
        memcpy(&a1, a + j + 8, 32);
        memcpy(&b0, b + j, 32);
        memcpy(&b1, b + j + 8, 32);
        acc0 += a0 * b0;
        acc1 += a1 * b1;
    }
    v8f acc = acc0 + acc1;
    float s = 0;
    for (int k = 0; k < 8; k++) s += acc[k];
    for (; j < n; j++) s += a[j] * b[j];
    return s;
}

void rmsnorm(float *out, const float *x, const float *w, int n, float eps) {
    double ss = 0;
    for (int i = 0; i < n; i++) ss += (double)x[i] * x[i];
    float r = 1.0f / sqrtf((float)(ss / n) + eps);
    for (int i = 0; i < n; i++) out[i] = x[i] * r * w[i];
}

// Unpacks row r of matrix i into f32: raw levels (quantized) or values (bf16/f32).
static void unpack_row(const struct qmat *w, int i, int r, float *out) {
    const uint8_t *row = w->data + (size_t)i * w->mat_stride + (size_t)r * w->row_stride;
    switch (w->type) {
    case WT_F32:
        memcpy(out, row, sizeof(float) * (size_t)w->cols);
        break;
    case WT_BF16:
        for (int j = 0; j < w->cols; j++) {
            uint16_t h;
            memcpy(&h, row + 2 * (size_t)j, 2);
            out[j] = bf16_to_f32(h);
        }
        break;
    case WT_Q4:
        for (int j = 0; j < w->cols; j += 8) {
            uint32_t word;
            memcpy(&word, row + (size_t)j / 2, 4);
            for (int k = 0; k < 8; k++) out[j + k] = (float)((word >> (4 * k)) & 15u);
        }
        break;
    case WT_Q8:
        for (int j = 0; j < w->cols; j++) out[j] = (float)row[j];
        break;
    }
}

struct matmul_job {
    const struct qmat *w;
    int i, T, ldy;
    const float *x;
    const float *xsum; // [T][groups] sums of x per quantization group
    float *y;
};

static void matmul_rows(void *ctx, int r0, int r1) {
    const struct matmul_job *J = ctx;
    const struct qmat *w = J->w;
    int cols = w->cols;
    float *row = xaligned(sizeof(float) * (size_t)cols);
    bool quant = w->type == WT_Q4 || w->type == WT_Q8;
    int groups = quant ? cols / w->group : 1;
    float sc[groups], bi[groups];
    for (int r = r0; r < r1; r++) {
        unpack_row(w, J->i, r, row);
        if (quant) {
            size_t sb = (size_t)J->i * w->sb_mat_stride + (size_t)r * w->sb_row_stride;
            for (int g = 0; g < groups; g++) {
                uint16_t hs, hb;
                memcpy(&hs, w->scales + sb + 2 * (size_t)g, 2);
                memcpy(&hb, w->biases + sb + 2 * (size_t)g, 2);
                sc[g] = bf16_to_f32(hs);
                bi[g] = bf16_to_f32(hb);
            }
        }
        for (int t = 0; t < J->T; t++) {
            const float *x = J->x + (size_t)t * cols;
            float acc;
            if (!quant) {
                acc = dot_f32(row, x, cols);
            } else {
                acc = 0;
                const float *xs = J->xsum + (size_t)t * groups;
                for (int g = 0; g < groups; g++)
                    acc += sc[g] * dot_f32(row + g * w->group, x + g * w->group, w->group) +
                           bi[g] * xs[g];
            }
            J->y[(size_t)t * J->ldy + r] = acc;
        }
    }
    free(row);
}

void cpu_matmul(struct threadpool *tp, const struct qmat *w, int i, const float *x, int T, float *y,
                int ldy) {
    if (T <= 0) return;
    struct matmul_job J = {.w = w, .i = i, .T = T, .ldy = ldy, .x = x, .y = y};
    float *xsum = NULL;
    if (w->type == WT_Q4 || w->type == WT_Q8) {
        int groups = w->cols / w->group;
        xsum = xmalloc(sizeof(float) * (size_t)T * (size_t)groups);
        for (int t = 0; t < T; t++)
            for (int g = 0; g < groups; g++) {
                float s = 0;
                const float *xg = x + (size_t)t * w->cols + (size_t)g * w->group;
                for (int j = 0; j < w->group; j++) s += xg[j];
                xsum[(size_t)t * groups + g] = s;
            }
        J.xsum = xsum;
    }
    // Enough rows per block that each thread streams a useful slice of the weights.
    parallel_for(tp, w->rows, 4, matmul_rows, &J);
    free(xsum);
}
