// What `wren run` and `wren chat` share: their options, the loaded model (engine, session,
// tokenizer, chat format, sampling defaults) and one "turn": render -> tokenize -> reuse the
// session's state -> feed -> generate -> stream the text, split into reasoning and content.
#pragma once
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "engine/engine.h"
#include "engine/gen_config.h"
#include "engine/sampler.h"
#include "text/chat.h"
#include "text/tokenizer.h"
#include "util/err.h"

struct cJSON;

#define GEN_MAX_STOPS 16

struct gen_opts {
    struct wren_engine_opts engine;
    struct sampler_params sampling; // values of the fields in `set`
    unsigned set;                   // SAMPLER_SET_* bits: fields the command line set
    int max_tokens; // 0: until an end token, a stop string or the end of the context
    const char *stop[GEN_MAX_STOPS];
    int n_stop;
    const char *system;
    bool no_think;
    const char *log_path; // JSON lines, one per turn: token ids and counts (tests, debugging)
};

void gen_opts_init(struct gen_opts *o);
// Consumes one generation or engine option at argv[*i]: 1 consumed, 0 not ours, -1 error printed.
int gen_opt(struct gen_opts *o, int argc, char **argv, int *i);
#define GEN_OPTS_HELP                                                                              \
    "  --system TEXT            system message\n"                                                  \
    "  --no-think               answer without the reasoning block\n"                              \
    "  --max-tokens N           stop after N generated tokens (default: no limit)\n"               \
    "  --temp T                 temperature, 0 = greedy (default: generation_config.json, 1)\n"    \
    "  --top-k K                keep the K most likely tokens (0 = off)\n"                         \
    "  --top-p P                nucleus sampling mass (1 = off)\n"                                 \
    "  --min-p P                drop tokens below P x the most likely one (0 = off)\n"             \
    "  --presence-penalty X     OpenAI presence penalty over generated tokens\n"                   \
    "  --frequency-penalty X    OpenAI frequency penalty over generated tokens\n"                  \
    "  --repetition-penalty X   HF repetition penalty over prompt + generated tokens (1 = off)\n"  \
    "  --seed N                 sampling seed, the same for every chat turn (default: random)\n"   \
    "  --stop TEXT              stop at TEXT, not printed (repeatable)\n"                          \
    "  --log FILE               append one JSON line per turn (token ids, counts)\n"

struct gen {
    const struct gen_opts *o;
    struct wren_engine *en;
    struct wren_session *s;
    struct tokenizer *tok;
    enum chat_flavor flavor;
    struct sampler_params sampling; // defaults < generation_config.json < command line
    struct eos_set eos;
    bool snapshots;             // keep a snapshot per turn for the next one (chat)
    struct wren_snapshot *snap; // state at the end of the last user turn (see gen_chat_turn)
    FILE *log;
    volatile sig_atomic_t *interrupted; // set by a SIGINT handler; stops the generation
    bool out_tty;                       // stdout is a terminal: reasoning dimmed inline
};

// Loads the model, tokenizer and defaults and opens a session.
int gen_open(struct gen *g, const struct gen_opts *o, struct wren_err *e);
void gen_close(struct gen *g);
// Forgets the conversation state (session and snapshot).
void gen_reset(struct gen *g);

// Timing: t_prefill covers feeding the new prompt tokens; t_gen the whole generate call (the
// first token comes from the prefill's logits, each later one costs a decode step), so the
// decode rate reported is n_gen / t_gen.
struct turn_out {
    char *reasoning, *content; // malloc'd, NUL-terminated (what was printed)
    int n_prompt;              // prompt tokens
    int n_reused;              // of them, already in the session's state
    int n_gen;                 // tokens generated (including an end token)
    double t_prefill, t_gen;   // seconds
    const char *finish;        // "stop" (end token or stop string), "length", "interrupted"
};
void turn_out_free(struct turn_out *t);

// One assistant turn over an OpenAI-style `messages` array, rendered with the chat template
// (thinking on or off). Streams the reply to stdout (reasoning: dimmed, or to stderr when stdout
// is not a terminal).
//
// State reuse: the Qwen template drops the reasoning of assistant turns before the last user
// message, so the re-rendered history is not what the session generated. A snapshot of the
// state is therefore taken at the end of the conversation without the generation prompt (i.e.
// after the last user turn), which is a prefix of the next turn's rendering. Each turn continues
// from the longest state that is a token-exact prefix of the new prompt: the session itself,
// else that snapshot, else nothing (full prefill). The state never mixes in tokens that are not
// in the prompt.
int gen_chat_turn(struct gen *g, const struct cJSON *messages, bool think, struct turn_out *out,
                  struct wren_err *e);
// One turn over raw prompt text (no template, no reasoning split).
int gen_raw_turn(struct gen *g, const char *text, struct turn_out *out, struct wren_err *e);

// "prompt 25 tokens, prefill 120.3 tok/s | generated 64 tokens, decode 11.9 tok/s" on stderr;
// with_reuse adds "prefilled N new tokens, M reused".
void turn_summary(const struct turn_out *t, bool with_reuse);
