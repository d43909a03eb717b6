// A checkpoint's generation_config.json: the sampling defaults and end-of-sequence ids its
// authors recommend. Requests and CLI flags override what is read here.
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "engine/sampler.h"
#include "model/config.h"
#include "util/err.h"

struct tokenizer;

struct gen_config {
    bool found;                     // the file exists
    struct sampler_params sampling; // sampler_defaults() with the file's values applied
    int n_eos;
    int32_t eos[WREN_MAX_EOS];
};

// Reads DIR/generation_config.json. A missing file is not an error (found = false, defaults);
// a malformed one is. Keys used: temperature, top_k, top_p, min_p, repetition_penalty,
// do_sample (false: greedy), eos_token_id (integer or list).
int gen_config_load(const char *dir, struct gen_config *gc, struct wren_err *e);
// The same from JSON text; `path` names it in messages.
int gen_config_parse(const char *json, size_t len, const char *path, struct gen_config *gc,
                     struct wren_err *e);

// The token ids that end a generation, for every command that generates (run, chat, serve):
// generation_config.json's eos_token_id, config.json's, and the chat format's <|im_end|> and
// <|endoftext|> (a checkpoint may list only some of them). Duplicates are kept once.
struct eos_set {
    int n;
    int32_t ids[2 * WREN_MAX_EOS + 2];
};

// gc and mc may be NULL (nothing to add from them).
void eos_set_build(struct eos_set *s, const struct gen_config *gc, const struct model_config *mc,
                   const struct tokenizer *tok);
bool eos_set_has(const struct eos_set *s, int32_t id);
