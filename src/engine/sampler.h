// Token sampling on the host: the CPU backend's sampler and the reference for device samplers.
// Order of the steps (device samplers must follow it):
//   1. ids >= n_vocab are never considered (the embedding is padded past the tokenizer);
//   2. repetition penalty (HF): over ids in history + accepted tokens, positive logits are divided
//      by it, negative ones multiplied;
//   3. presence/frequency penalties (OpenAI): logit -= count * frequency + presence, over ids
//      accepted so far (count > 0), not the prompt;
//   4. logprobs: log-softmax of these penalised logits at temperature 1 (independent of the
//      temperature and truncation below), sampled id and the top n_logprobs (<= 20);
//   5. temperature < 1e-5: argmax (lowest id on ties). Otherwise divide by the temperature,
//      keep the top_k largest, then the smallest most-likely-first prefix whose probability
//      (renormalised over what is left) reaches top_p, then drop ids whose probability is below
//      min_p times the most likely one (HF order: temperature, top-k, top-p, min-p), and draw
//      with xoshiro256** seeded from `seed` through splitmix64: one u = (next >> 11) * 2^-53
//      per token, times the kept total weight; the token is the first kept id, in ascending id
//      order, whose cumulative weight exp(l/T - max) exceeds it. The same seed and logits give
//      the same ids.
// After sampler_sample the logits row holds the penalised logits (steps 2-3).
#pragma once
#include <stdbool.h>
#include <stdint.h>

struct sampler_params {
    float temperature;        // < 1e-5 (e.g. 0): greedy (argmax)
    int top_k;                // <= 0: off
    float top_p;              // >= 1: off
    float min_p;              // <= 0: off
    float presence_penalty;   // OpenAI semantics, over generated tokens; 0: off
    float frequency_penalty;  // OpenAI semantics, over generated tokens; 0: off
    float repetition_penalty; // HF semantics, over prompt + generated tokens; 1: off
    uint64_t seed;
    int n_vocab;    // ids >= n_vocab are never sampled (the embedding is padded past the tokenizer)
    int n_logprobs; // < 0: no logprobs; else report the sampled logprob and this many top ones
};

// Which sampling fields a request or the command line set explicitly (overriding the model's
// generation_config.json defaults).
enum {
    SAMPLER_SET_TEMPERATURE = 1 << 0,
    SAMPLER_SET_TOP_K = 1 << 1,
    SAMPLER_SET_TOP_P = 1 << 2,
    SAMPLER_SET_MIN_P = 1 << 3,
    SAMPLER_SET_PRESENCE = 1 << 4,
    SAMPLER_SET_FREQUENCY = 1 << 5,
    SAMPLER_SET_REPETITION = 1 << 6,
    SAMPLER_SET_SEED = 1 << 7,
};

// Copies the fields of `over` whose SAMPLER_SET_* bit is in `set` onto p.
void sampler_params_overlay(struct sampler_params *p, const struct sampler_params *over,
                            unsigned set);

#define WREN_MAX_TOP_LOGPROBS 20

struct sampled_token {
    int32_t id;
    float logprob; // of the sampled id under the (penalised, temperature-1) distribution
    int n_top;
    int32_t top_id[WREN_MAX_TOP_LOGPROBS];
    float top_logprob[WREN_MAX_TOP_LOGPROBS];
};

struct sampler;

// `history` (prompt tokens so far) seeds the repetition penalty. `vocab` = logits row length.
struct sampler *sampler_new(const struct sampler_params *p, int vocab, const int32_t *history,
                            int n_history);
void sampler_free(struct sampler *s);
// Picks the next token from logits[vocab] (logits are modified in place). Does not record it.
void sampler_sample(struct sampler *s, float *logits, struct sampled_token *out);
// Records an emitted token for the penalties.
void sampler_accept(struct sampler *s, int32_t token);
// Defaults used when neither the request nor generation_config.json says otherwise: greedy off,
// temperature 1, no truncation, no penalties.
struct sampler_params sampler_defaults(void);
