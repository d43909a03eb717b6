// The backend interface: a few model-level operations, not a list of tensor ops, so that a backend
// owns the whole forward pass (the CUDA backend captures a decode step as one graph and keeps the
// next token on the GPU; the CPU backend stays a readable reference). Shared between backends is
// data (struct model, the quant layout, state sizes), not control flow. A Metal backend would
// implement the same table.
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "engine/sampler.h"
#include "model/weights.h"
#include "util/err.h"

struct backend;
struct bstate; // per-sequence state: KV cache of the attention layers, conv + recurrent state
struct bsnap;  // a saved copy of a bstate at some position

// Called by generate() for each sampled token; return nonzero to stop after this token.
typedef int (*gen_token_cb)(void *ud, const struct sampled_token *tok);

struct backend_ops {
    const char *name;
    void (*destroy)(struct backend *b);

    struct bstate *(*state_new)(struct backend *b, int max_ctx, struct wren_err *e);
    void (*state_free)(struct backend *b, struct bstate *s);

    // Runs tokens [0, n) at sequence positions [pos, pos + n) (pos = tokens already in s;
    // n <= b->max_chunk). Always leaves the last position's logits in the state (for generate);
    // also copies them to `logits` if non-NULL: [n][vocab] when all_logits, else [vocab].
    int (*forward)(struct backend *b, struct bstate *s, int pos, const int32_t *tokens, int n,
                   float *logits, bool all_logits, struct wren_err *e);

    // Copies the logits left in s by the last forward (or a restored snapshot) to out[vocab].
    int (*read_logits)(struct backend *b, struct bstate *s, float *out, struct wren_err *e);

    // Samples up to max_new tokens starting from the logits left in s by the last forward, feeding
    // each sampled token back. `history` is the whole sequence so far (for penalties). Sets *fed to
    // the number of sampled tokens whose effect is now in s (all of them, or all but the last).
    // NULL: the engine runs forward(n = 1) and the host sampler instead.
    int (*generate)(struct backend *b, struct bstate *s, int pos, const struct sampler_params *p,
                    const int32_t *history, int n_history, int max_new, gen_token_cb cb, void *ud,
                    int *n_generated, int *fed, struct wren_err *e);

    // Snapshots of the state at position pos. Without KV only the recurrent/conv state is saved:
    // restoring it is valid only into the same bstate while its KV rows [0, pos) are unchanged.
    struct bsnap *(*snap_save)(struct backend *b, struct bstate *s, int pos, bool with_kv,
                               struct wren_err *e);
    int (*snap_restore)(struct backend *b, struct bstate *s, const struct bsnap *snap,
                        struct wren_err *e);
    size_t (*snap_bytes)(const struct bsnap *snap);
    void (*snap_free)(struct backend *b, struct bsnap *snap);
};

struct backend {
    const struct backend_ops *ops;
    const struct model *model;
    int max_chunk;        // largest n forward accepts
    size_t device_bytes;  // memory the backend holds for weights (0 for the CPU's mmap)
    double kv_elem_bytes; // bytes per cached K/V element, scales included (f32 4, bf16 2, int8 ~1)
};

struct backend_opts {
    const char *name;  // "cpu", "cuda" or "auto"
    int threads;       // CPU threads (0: all cores)
    int prefill_chunk; // 0: backend default
    int device;        // GPU index
    bool kv_int8;      // K/V cached as int8 codes with a scale per row (backend/kv_int8.h)
};

// Creates the named backend for a loaded model ("auto": CUDA when a GPU is usable, else CPU).
struct backend *backend_create(const struct model *m, const struct backend_opts *o,
                               struct wren_err *e);
bool backend_cuda_available(void);

// Per-backend constructors, used by backend_create only.
struct backend *cpu_backend_create(const struct model *m, const struct backend_opts *o,
                                   struct wren_err *e);
struct backend *cuda_backend_create(const struct model *m, const struct backend_opts *o,
                                    struct wren_err *e);
int cuda_device_count(void);
