// The engine API used by the CLI and the server: open a model on a backend, run sessions. Callers
// see token ids, logits and sampling parameters, never tensors.
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "engine/sampler.h"
#include "model/config.h"
#include "util/err.h"

// An engine and its sessions are used by one thread at a time (the server has one worker that owns
// them); the backends are not reentrant.
struct wren_engine;
struct wren_session;
struct wren_snapshot;

struct wren_engine_opts {
    const char *model_dir;
    const char *backend; // "cpu", "cuda", "auto" (NULL: auto)
    int threads;         // 0: all cores
    int prefill_chunk;   // 0: backend default
    int device;          // GPU index
    int ctx;             // default session context (0: min(model max, 32768))
    bool kv_int8;        // --kv-cache int8
};

struct wren_engine *wren_engine_open(const struct wren_engine_opts *o, struct wren_err *e);
void wren_engine_close(struct wren_engine *en);
const struct model_config *wren_engine_config(const struct wren_engine *en);
const char *wren_engine_backend(const struct wren_engine *en);
const char *wren_engine_model_dir(const struct wren_engine *en);
size_t wren_engine_weight_bytes(const struct wren_engine *en);
// Tokens per prefill call of the backend (--prefill-chunk, or its default: CUDA 8192 or 4096 by
// device memory, CPU 256).
int wren_engine_prefill_chunk(const struct wren_engine *en);
// Minimum bytes one decode step moves at context length ctx: the weights one token reads, the
// DeltaNet state (read and written) and the KV cache (at the backend's KV precision).
double wren_engine_decode_bytes(const struct wren_engine *en, int ctx);
// FLOPs of prefilling n tokens from position 0 (projections + causal attention).
double wren_engine_prefill_flops(const struct wren_engine *en, int n);

// A sequence with its own state, able to hold max_ctx tokens (0: the engine's default context).
struct wren_session *wren_session_new(struct wren_engine *en, int max_ctx, struct wren_err *e);
void wren_session_free(struct wren_session *s);
// Forgets everything (cheap). If a fresh state cannot be made, later calls fail with the reason.
void wren_session_reset(struct wren_session *s);
int wren_session_max_ctx(const struct wren_session *s);

// The sequence so far: every token fed or generated (the last generated one may not be in the
// state yet; it is fed first by the next feed or generate).
int wren_session_len(const struct wren_session *s);
const int32_t *wren_session_tokens(const struct wren_session *s);

typedef void (*wren_progress_cb)(void *ud, int done, int total);

// Appends tokens to the sequence and runs them through the model in chunks. logits: NULL, or
// [n][vocab] of every new position when all_logits, else [vocab] of the last one.
int wren_session_feed(struct wren_session *s, const int32_t *tokens, int n, float *logits,
                      bool all_logits, wren_progress_cb progress, void *ud, struct wren_err *e);

// Samples up to max_new tokens after the sequence, calling cb for each (nonzero stops). The
// sampled tokens join the sequence. *n_out = tokens generated. Requires a prior feed.
typedef int (*wren_token_cb)(void *ud, const struct sampled_token *tok);
int wren_session_generate(struct wren_session *s, const struct sampler_params *p, int max_new,
                          wren_token_cb cb, void *ud, int *n_out, struct wren_err *e);

// Snapshots: the state after the first len tokens (len = current length). with_kv copies the KV
// cache too, so the snapshot can be restored after the session has diverged before len.
struct wren_snapshot *wren_session_snapshot(struct wren_session *s, bool with_kv,
                                            struct wren_err *e);
int wren_session_restore(struct wren_session *s, const struct wren_snapshot *snap,
                         struct wren_err *e);
int wren_snapshot_len(const struct wren_snapshot *snap);
const int32_t *wren_snapshot_tokens(const struct wren_snapshot *snap);
size_t wren_snapshot_bytes(const struct wren_snapshot *snap);
void wren_snapshot_free(struct wren_snapshot *snap);
