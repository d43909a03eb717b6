// Byte-level BPE tokenizer read from a Hugging Face tokenizer.json (the kind Qwen uses):
// NFC normalizer, regex split read from the file, ByteLevel mapping, merges by rank, added tokens
// matched in the raw text first.
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "util/err.h"

struct tokenizer;

// Loads DIR/tokenizer.json (DIR may also be the tokenizer.json file itself). Everything encoding
// and decoding need is in that file; tokenizer_config.json is not read.
struct tokenizer *tokenizer_load(const char *dir, struct wren_err *e);
void tokenizer_free(struct tokenizer *t);

// Encodes UTF-8 text (special/added tokens in the text are recognised). Invalid UTF-8 is an error.
// *ids is malloc'd; returns the number of ids or -1. Safe to call from several threads at once.
int tokenizer_encode(const struct tokenizer *t, const char *text, size_t len, int32_t **ids,
                     struct wren_err *e);
// Number of token ids the tokenizer defines (BPE vocabulary + added tokens): ids >= this never
// appear (the model's embedding may be padded past it).
int tokenizer_n_vocab(const struct tokenizer *t);
// Id of a token given its string form (e.g. "<|im_end|>"), or -1.
int32_t tokenizer_token_id(const struct tokenizer *t, const char *token);
bool tokenizer_is_special(const struct tokenizer *t, int32_t id);
// The raw bytes a token stands for (after byte-level decoding); NULL for an unknown id.
const char *tokenizer_token_bytes(const struct tokenizer *t, int32_t id, size_t *len);
// Length in bytes of the longest token.
size_t tokenizer_max_token_len(const struct tokenizer *t);

// Streaming detokenizer: emits text only once the bytes form complete UTF-8 characters.
struct detok {
    char pending[8];
    int n_pending;
};
// Start a stream with `struct detok d = {0};`.
// Appends the text of `id` to out (cap bytes) and returns the number of bytes written; bytes of an
// incomplete character are held in d until completed. Invalid sequences become U+FFFD (one per
// maximal ill-formed subpart, as String::from_utf8_lossy / Python's errors='replace' on the whole
// stream). Unknown ids add nothing. Output beyond cap is cut: give at least detok_out_cap(t).
size_t detok_push(const struct tokenizer *t, struct detok *d, int32_t id, char *out, size_t cap);
// Flushes held bytes (as U+FFFD) at the end of a stream.
size_t detok_flush(struct detok *d, char *out, size_t cap);
// Output room that one detok_push or detok_flush can need.
size_t detok_out_cap(const struct tokenizer *t);
