// Subcommands of the wren CLI. Each parses its own options once into a struct (with the shared
// engine options below) and returns the process exit status.
#pragma once
#include <stdbool.h>

#include "engine/engine.h"

int cmd_run(int argc, char **argv);
int cmd_chat(int argc, char **argv);
int cmd_serve(int argc, char **argv);
int cmd_bench(int argc, char **argv);
int cmd_logits(int argc, char **argv);
int cmd_perplexity(int argc, char **argv);
int cmd_synth(int argc, char **argv);
int cmd_tokenize(int argc, char **argv);
int cmd_detokenize(int argc, char **argv);
int cmd_template(int argc, char **argv);

// Options every model-running command accepts: -m DIR, --backend, --threads, --prefill-chunk,
// --device, --ctx, --kv-cache. opt_engine() consumes one such option at argv[*i] (advancing *i past
// its value) and returns 1, returns 0 if argv[*i] is not one of them, or -1 after printing an
// error.
int opt_engine(struct wren_engine_opts *o, int argc, char **argv, int *i);
#define OPT_ENGINE_HELP                                                                            \
    "  -m, --model DIR          checkpoint directory (config.json + safetensors)\n"                \
    "  --backend cpu|cuda|auto  compute backend (default auto)\n"                                  \
    "  --threads N              CPU threads (default: all cores)\n"                                \
    "  --prefill-chunk N        tokens per prefill chunk (default: backend's)\n"                   \
    "  --device N               GPU index (default 0)\n"                                           \
    "  --ctx N                  context length of a session (default: min(model max, 32768))\n"    \
    "  --kv-cache default|int8  K/V cache precision: the backend's (CPU f32, CUDA bf16), or "      \
    "int8\n"                                                                                       \
    "                           codes and a scale per 64 values (about half the CUDA bytes)\n"

// Value of the option at argv[*i] ("--name V" or "--name=V"); NULL (with an error printed) if
// absent.
const char *opt_value(int argc, char **argv, int *i);
// Parses an integer/float option value, printing an error naming the option when invalid.
int opt_int(const char *name, const char *v, long lo, long hi, int *out);
int opt_float(const char *name, const char *v, float *out);
int opt_float_in(const char *name, const char *v, float lo, float hi, float *out);
// Parses a comma-separated list of positive integers ("256,1K,4k" allowed). Returns count or -1.
int opt_int_list(const char *name, const char *v, int *out, int max);
// Reads a JSON array of token ids. Returns count or -1 (error in e).
int read_tokens_json(const char *path, int **out, struct wren_err *e);
