// Random values of one chunk of one tensor. Each (tensor stream, chunk) pair seeds its own
// xoshiro256** generator, so chunks can be made by any thread in any order with the same result.
#include <math.h>
#include <string.h>

#include "synth/synth.h"
#include "util/rng.h"
#include "util/util.h"

static void rng_seed_chunk(struct rng *r, uint64_t key, uint64_t chunk) {
    rng_seed(r, key ^ (chunk * 0xa0761d6478bd642full));
}

#define SCALE_JITTER 0.2f

// Scale of one group: mean-square chosen so that scale * code has the target std.
static inline float group_scale(struct rng *r, float std, int bits) {
    float levels = (float)(1u << bits);
    float sigma_q = sqrtf((levels * levels - 1.0f) / 12.0f);
    float j = (2.0f * rng_unit(r) - 1.0f) * SCALE_JITTER;
    return std / sigma_q * (1.0f + j) / sqrtf(1.0f + SCALE_JITTER * SCALE_JITTER / 3.0f);
}

static inline void put(const struct synth_tensor *t, uint8_t *out, size_t i, float v) {
    if (t->st.dtype == ST_F32)
        memcpy(out + 4 * i, &v, 4);
    else {
        uint16_t h = f32_to_bf16(v);
        memcpy(out + 2 * i, &h, 2);
    }
}

void synth_fill(const struct synth_tensor *t, size_t chunk_index, uint8_t *out, size_t n) {
    struct rng r;
    rng_seed_chunk(&r, t->key, chunk_index);
    if (t->init == SI_QWEIGHT) { // every bit uniform: every code of every width uniform
        size_t i = 0;
        for (; i + 8 <= n; i += 8) {
            uint64_t x = rng_next(&r);
            memcpy(out + i, &x, 8);
        }
        if (i < n) {
            uint64_t x = rng_next(&r);
            memcpy(out + i, &x, n - i);
        }
        return;
    }
    size_t count = n / st_dtype_size(t->st.dtype);
    float levels_m1 = (float)((1u << t->bits) - 1);
    for (size_t i = 0; i < count; i++) {
        float v = 0, u;
        switch (t->init) {
        case SI_QSCALES:
            v = group_scale(&r, t->a, t->bits);
            break;
        case SI_QBIASES: // the bias centres the codes: -scale * (levels - 1) / 2, of the stored
                         // scale
            v = -bf16_to_f32(f32_to_bf16(group_scale(&r, t->a, t->bits))) * levels_m1 * 0.5f;
            break;
        case SI_NEAR:
            v = t->a + (2.0f * rng_unit(&r) - 1.0f) * t->b;
            break;
        case SI_UNIFORM:
            v = t->a + (t->b - t->a) * rng_unit(&r);
            break;
        case SI_LOGUNIF:
            u = rng_unit(&r);
            v = logf(t->a + (t->b - t->a) * u);
            break;
        case SI_QWEIGHT:
            break;
        }
        put(t, out, i, v);
    }
}
