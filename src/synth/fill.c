// Random values of one chunk of one tensor. Each (tensor stream, chunk) pair seeds its own
// xoshiro256** generator, so chunks can be made by any thread in any order with the same result.
#include <math.h>
#include <string.h>

#include "synth/synth.h"
#include "util/util.h"

struct rng {
    uint64_t s[4];
};

static uint64_t sm64(uint64_t *x) {
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static void rng_seed(struct rng *r, uint64_t key, uint64_t chunk) {
    uint64_t x = key ^ (chunk * 0xa0761d6478bd642full);
    for (int i = 0; i < 4; i++) r->s[i] = sm64(&x);
}

static inline uint64_t rotl(uint64_t x, int k) {
    return (x << k) | (x >> (64 - k));
}

static inline uint64_t rng_next(struct rng *r) {
    uint64_t *s = r->s;
    uint64_t out = rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return out;
}

static inline float rng_unit(struct rng *r) { // uniform in [0, 1)
    return (float)(rng_next(r) >> 40) * (1.0f / 16777216.0f);
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
    rng_seed(&r, t->key, chunk_index);
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
