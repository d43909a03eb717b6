// The tensor list of a checkpoint: names, dtypes and shapes exactly as mlx-lm / mlx-vlm write
// Qwen3.5/3.6 MoE models (see synth.h for the value rules), in the order their parameter trees
// flatten, and the shard each tensor goes to.
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "synth/synth.h"
#include "util/util.h"

static uint64_t splitmix64(uint64_t *x) {
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static uint64_t stream_key(uint64_t seed, const char *base, uint64_t salt) {
    uint64_t h = 0xcbf29ce484222325ull; // FNV-1a of the name
    for (const char *s = base; *s; s++) h = (h ^ (uint8_t)*s) * 0x100000001b3ull;
    uint64_t x = seed ^ h;
    splitmix64(&x);
    x ^= salt * 0xd1342543de82ef95ull;
    return splitmix64(&x);
}

struct builder {
    struct synth_plan *p;
    uint64_t seed;
};

static struct synth_tensor *push(struct builder *b, enum st_dtype dt, int ndim,
                                 const int64_t *shape, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
static struct synth_tensor *push(struct builder *b, enum st_dtype dt, int ndim,
                                 const int64_t *shape, const char *fmt, ...) {
    struct synth_plan *p = b->p;
    if (p->n == p->cap) {
        p->cap = p->cap ? 2 * p->cap : 256;
        p->t = xrealloc(p->t, sizeof *p->t * (size_t)p->cap);
    }
    struct synth_tensor *t = &p->t[p->n++];
    memset(t, 0, sizeof *t);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(t->name, sizeof t->name, fmt, ap);
    va_end(ap);
    t->st.dtype = dt;
    t->st.ndim = ndim;
    memcpy(t->st.shape, shape, sizeof(int64_t) * (size_t)ndim);
    size_t elems = 1;
    for (int i = 0; i < ndim; i++) elems *= (size_t)shape[i];
    t->st.nbytes = elems * st_dtype_size(dt);
    t->n_params = elems;
    t->key = stream_key(b->seed, t->name, 0);
    return t;
}

// A quantized linear (or embedding, or stack of n experts when n > 0): weight/scales/biases.
static void add_quant(struct builder *b, const char *base, int n, int out, int in, int bits,
                      int group) {
    int64_t sh[3];
    int nd = 0;
    if (n > 0) sh[nd++] = n;
    sh[nd++] = out;
    float std = 1.0f / sqrtf((float)in);
    uint64_t key = stream_key(b->seed, base, 1);

    sh[nd] = (int64_t)in * bits / 32;
    struct synth_tensor *t = push(b, ST_U32, nd + 1, sh, "%s.weight", base);
    t->init = SI_QWEIGHT;
    t->bits = bits;
    t->n_params = (uint64_t)t->n_params * 32 / (uint64_t)bits;

    sh[nd] = in / group;
    for (int k = 0; k < 2; k++) {
        t = push(b, ST_BF16, nd + 1, sh, "%s.%s", base, k ? "biases" : "scales");
        t->init = k ? SI_QBIASES : SI_QSCALES;
        t->bits = bits;
        t->a = std;
        t->key = key; // scales and biases of one matrix share their stream
        t->n_params = 0;
    }
}

static void add_vec(struct builder *b, enum st_dtype dt, int len, enum synth_init init, float a,
                    float c, const char *fmt, ...) __attribute__((format(printf, 7, 8)));
static void add_vec(struct builder *b, enum st_dtype dt, int len, enum synth_init init, float a,
                    float c, const char *fmt, ...) {
    char name[160];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(name, sizeof name, fmt, ap);
    va_end(ap);
    int64_t sh[1] = {len};
    struct synth_tensor *t = push(b, dt, 1, sh, "%s", name);
    t->init = init;
    t->a = a;
    t->b = c;
}

#define NORM_NOISE 0.05f

// A bf16 matrix of std 1/sqrt(fan_in), uniform.
static void add_dense(struct builder *b, int ndim, const int64_t *shape, int64_t fan_in,
                      const char *name) {
    struct synth_tensor *t = push(b, ST_BF16, ndim, shape, "%s", name);
    float h = sqrtf(3.0f / (float)fan_in);
    t->init = SI_UNIFORM;
    t->a = -h;
    t->b = h;
}

static void add_vision(struct builder *b, const struct synth_dims *d) {
    const char *v = "vision_tower";
    char name[160];
    int H = d->v_hidden;
    int64_t pe[5] = {H, d->v_temporal, d->v_patch, d->v_patch, d->v_in_ch}; // MLX Conv3d layout
    snprintf(name, sizeof name, "%s.patch_embed.proj.weight", v);
    add_dense(b, 5, pe, (int64_t)d->v_temporal * d->v_patch * d->v_patch * d->v_in_ch, name);
    add_vec(b, ST_BF16, H, SI_NEAR, 0, 0.02f, "%s.patch_embed.proj.bias", v);
    int64_t pos[2] = {d->v_pos, H};
    snprintf(name, sizeof name, "%s.pos_embed.weight", v);
    add_dense(b, 2, pos, H, name);
    for (int i = 0; i < d->v_depth; i++) {
        for (int k = 1; k <= 2; k++) {
            add_vec(b, ST_BF16, H, SI_NEAR, 1, NORM_NOISE, "%s.blocks.%d.norm%d.weight", v, i, k);
            add_vec(b, ST_BF16, H, SI_NEAR, 0, 0.02f, "%s.blocks.%d.norm%d.bias", v, i, k);
        }
        struct {
            const char *name;
            int out, in;
        } lin[4] = {{"attn.qkv", 3 * H, H},
                    {"attn.proj", H, H},
                    {"mlp.linear_fc1", d->v_inter, H},
                    {"mlp.linear_fc2", H, d->v_inter}};
        for (int k = 0; k < 4; k++) {
            int64_t sh[2] = {lin[k].out, lin[k].in};
            snprintf(name, sizeof name, "%s.blocks.%d.%s.weight", v, i, lin[k].name);
            add_dense(b, 2, sh, lin[k].in, name);
            add_vec(b, ST_BF16, lin[k].out, SI_NEAR, 0, 0.02f, "%s.blocks.%d.%s.bias", v, i,
                    lin[k].name);
        }
    }
    int M = H * d->v_merge * d->v_merge;
    add_vec(b, ST_BF16, H, SI_NEAR, 1, NORM_NOISE, "%s.merger.norm.weight", v);
    add_vec(b, ST_BF16, H, SI_NEAR, 0, 0.02f, "%s.merger.norm.bias", v);
    int64_t f1[2] = {M, M}, f2[2] = {d->v_out, M};
    snprintf(name, sizeof name, "%s.merger.linear_fc1.weight", v);
    add_dense(b, 2, f1, M, name);
    add_vec(b, ST_BF16, M, SI_NEAR, 0, 0.02f, "%s.merger.linear_fc1.bias", v);
    snprintf(name, sizeof name, "%s.merger.linear_fc2.weight", v);
    add_dense(b, 2, f2, M, name);
    add_vec(b, ST_BF16, d->v_out, SI_NEAR, 0, 0.02f, "%s.merger.linear_fc2.bias", v);
}

static void add_deltanet(struct builder *b, const struct synth_dims *d, const char *L) {
    int qk = d->dn_k_heads * d->dn_k_dim, vd = d->dn_v_heads * d->dn_v_dim;
    int conv = 2 * qk + vd, g = d->group, q = d->bits;
    char base[160];
    int64_t cs[3] = {conv, d->conv_kernel, 1}; // MLX Conv1d layout [C, K, 1]
    struct synth_tensor *t = push(b, ST_BF16, 3, cs, "%s.linear_attn.conv1d.weight", L);
    float h = sqrtf(3.0f / (float)d->conv_kernel);
    t->init = SI_UNIFORM;
    t->a = -h;
    t->b = h;
    snprintf(base, sizeof base, "%s.linear_attn.in_proj_qkv", L);
    add_quant(b, base, 0, conv, d->hidden, q, g);
    snprintf(base, sizeof base, "%s.linear_attn.in_proj_z", L);
    add_quant(b, base, 0, vd, d->hidden, q, g);
    snprintf(base, sizeof base, "%s.linear_attn.in_proj_b", L);
    add_quant(b, base, 0, d->dn_v_heads, d->hidden, q, g);
    snprintf(base, sizeof base, "%s.linear_attn.in_proj_a", L);
    add_quant(b, base, 0, d->dn_v_heads, d->hidden, q, g);
    add_vec(b, ST_BF16, d->dn_v_heads, SI_UNIFORM, -0.5f, 0.5f, "%s.linear_attn.dt_bias", L);
    add_vec(b, ST_F32, d->dn_v_heads, SI_LOGUNIF, 1, 16, "%s.linear_attn.A_log", L);
    add_vec(b, ST_BF16, d->dn_v_dim, SI_NEAR, 1, NORM_NOISE, "%s.linear_attn.norm.weight", L);
    snprintf(base, sizeof base, "%s.linear_attn.out_proj", L);
    add_quant(b, base, 0, d->hidden, vd, q, g);
}

static void add_attention(struct builder *b, const struct synth_dims *d, const char *L) {
    int g = d->group, q = d->bits, hd = d->head_dim;
    char base[160];
    snprintf(base, sizeof base, "%s.self_attn.q_proj", L); // query and output gate per head
    add_quant(b, base, 0, d->n_heads * hd * 2, d->hidden, q, g);
    snprintf(base, sizeof base, "%s.self_attn.k_proj", L);
    add_quant(b, base, 0, d->n_kv_heads * hd, d->hidden, q, g);
    snprintf(base, sizeof base, "%s.self_attn.v_proj", L);
    add_quant(b, base, 0, d->n_kv_heads * hd, d->hidden, q, g);
    snprintf(base, sizeof base, "%s.self_attn.o_proj", L);
    add_quant(b, base, 0, d->hidden, d->n_heads * hd, q, g);
    add_vec(b, ST_BF16, hd, SI_NEAR, 1, NORM_NOISE, "%s.self_attn.q_norm.weight", L);
    add_vec(b, ST_BF16, hd, SI_NEAR, 1, NORM_NOISE, "%s.self_attn.k_norm.weight", L);
}

static void add_moe(struct builder *b, const struct synth_dims *d, const char *L) {
    int g = d->group, q = d->bits, H = d->hidden, E = d->n_experts, I = d->expert_inter;
    int S = d->shared_inter;
    char base[160];
    snprintf(base, sizeof base, "%s.mlp.gate", L);
    add_quant(b, base, 0, E, H, d->gate_bits, g);
    snprintf(base, sizeof base, "%s.mlp.switch_mlp.gate_proj", L);
    add_quant(b, base, E, I, H, q, g);
    snprintf(base, sizeof base, "%s.mlp.switch_mlp.up_proj", L);
    add_quant(b, base, E, I, H, q, g);
    snprintf(base, sizeof base, "%s.mlp.switch_mlp.down_proj", L);
    add_quant(b, base, E, H, I, q, g);
    snprintf(base, sizeof base, "%s.mlp.shared_expert.gate_proj", L);
    add_quant(b, base, 0, S, H, q, g);
    snprintf(base, sizeof base, "%s.mlp.shared_expert.down_proj", L);
    add_quant(b, base, 0, H, S, q, g);
    snprintf(base, sizeof base, "%s.mlp.shared_expert.up_proj", L);
    add_quant(b, base, 0, S, H, q, g);
    snprintf(base, sizeof base, "%s.mlp.shared_expert_gate", L);
    add_quant(b, base, 0, 1, H, d->gate_bits, g);
}

void synth_plan_build(struct synth_plan *p, const struct synth_dims *d, uint64_t seed,
                      uint64_t shard_bytes) {
    memset(p, 0, sizeof *p);
    struct builder b = {p, seed};
    if (d->vision) add_vision(&b, d);
    const char *M = "language_model.model";
    char base[160];
    snprintf(base, sizeof base, "%s.embed_tokens", M);
    add_quant(&b, base, 0, d->vocab, d->hidden, d->bits, d->group);
    for (int i = 0; i < d->n_layers; i++) {
        char L[96];
        snprintf(L, sizeof L, "%s.layers.%d", M, i);
        if (synth_is_full_attention(d, i))
            add_attention(&b, d, L);
        else
            add_deltanet(&b, d, L);
        add_vec(&b, ST_BF16, d->hidden, SI_NEAR, 1, NORM_NOISE, "%s.input_layernorm.weight", L);
        add_vec(&b, ST_BF16, d->hidden, SI_NEAR, 1, NORM_NOISE,
                "%s.post_attention_layernorm.weight", L);
        add_moe(&b, d, L);
    }
    add_vec(&b, ST_BF16, d->hidden, SI_NEAR, 1, NORM_NOISE, "%s.norm.weight", M);
    add_quant(&b, "language_model.lm_head", 0, d->vocab, d->hidden, d->bits, d->group);

    uint64_t in_shard = 0;
    int shard = 0;
    for (int i = 0; i < p->n; i++) {
        struct synth_tensor *t = &p->t[i];
        t->st.name = t->name;
        if (in_shard > 0 && in_shard + t->st.nbytes > shard_bytes) shard++, in_shard = 0;
        t->shard = shard;
        in_shard += t->st.nbytes;
        p->total_bytes += t->st.nbytes;
        p->total_params += t->n_params;
    }
    p->n_shards = shard + 1;
}

void synth_plan_free(struct synth_plan *p) {
    free(p->t);
    memset(p, 0, sizeof *p);
}

void synth_shard_name(const struct synth_plan *p, int i, char *out, size_t cap) {
    if (p->n_shards == 1)
        snprintf(out, cap, "model.safetensors");
    else
        snprintf(out, cap, "model-%05d-of-%05d.safetensors", i + 1, p->n_shards);
}
