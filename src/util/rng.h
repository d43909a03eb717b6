// xoshiro256** seeded through splitmix64 (Blackman & Vigna): small, fast, and the same stream on
// every platform, unlike rand(). Used by the sampler and by wren synth.
#pragma once
#include <stdint.h>

struct rng {
    uint64_t s[4];
};

static inline uint64_t splitmix64(uint64_t *x) {
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

// The four state words drawn from splitmix64 starting at x.
static inline void rng_seed(struct rng *r, uint64_t x) {
    for (int i = 0; i < 4; i++) r->s[i] = splitmix64(&x);
}

static inline uint64_t rng_rotl(uint64_t x, int k) {
    return (x << k) | (x >> (64 - k));
}

static inline uint64_t rng_next(struct rng *r) {
    uint64_t *s = r->s;
    uint64_t out = rng_rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rng_rotl(s[3], 45);
    return out;
}

static inline double rng_uniform(struct rng *r) { // [0, 1), 53 bits
    return (double)(rng_next(r) >> 11) * 0x1.0p-53;
}

static inline float rng_unit(struct rng *r) { // [0, 1), 24 bits
    return (float)(rng_next(r) >> 40) * (1.0f / 16777216.0f);
}
