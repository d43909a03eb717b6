// The OpenAI chat-completions request, parsed and validated once (the only place that reads the
// request JSON's fields). Pure: no engine, no tokenizer, so it can be fuzzed on its own.
#pragma once

#include "engine/sampler.h"
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct cJSON;

#define OAI_MAX_STOP     4
#define OAI_MAX_STOP_LEN 256

enum oai_tool_choice {
    TOOL_CHOICE_AUTO,
    TOOL_CHOICE_NONE,
    TOOL_CHOICE_REQUIRED,
    TOOL_CHOICE_NAMED
};

struct oai_request {
    struct cJSON *root; // the whole request (owned); chat_render reads messages/tools from it
    bool stream;
    bool include_usage;
    int max_tokens; // 0: until the context is full
    unsigned set;   // SAMPLER_SET_* bits: the fields of `sampling` the request set
    struct sampler_params sampling;
    int n_stop;
    char *stop[OAI_MAX_STOP];
    const struct cJSON *tools; // NULL when absent or tool_choice is "none" (then removed from root)
    enum oai_tool_choice tool_choice;
    char *tool_name; // TOOL_CHOICE_NAMED
    bool enable_thinking;
    bool logprobs;
    int top_logprobs;
    char *replay; // test-only "wren_replay": text replayed as the model's output
};

struct oai_limits {
    int max_messages;
    size_t max_string; // longest string anywhere in the request (bytes)
};

// An OpenAI-style error: HTTP status, type, message and the offending parameter (may be "").
struct oai_error {
    int status;
    const char *type; // "invalid_request_error", ...
    char param[64];
    char msg[512];
};

// Parses body[len]. Returns 0, or -1 with err filled (status 400). allow_replay: accept the
// test-only "wren_replay" field (otherwise it is rejected like any unknown typed misuse).
int oai_request_parse(const char *body, size_t len, const struct oai_limits *lim, bool allow_replay,
                      struct oai_request *out, struct oai_error *err);
void oai_request_free(struct oai_request *r);

int oai_errorf(struct oai_error *err, int status, const char *type, const char *param,
               const char *fmt, ...) __attribute__((format(printf, 5, 6)));

// True when s[len] is well-formed UTF-8 (no overlongs, surrogates or code points > U+10FFFF).
bool utf8_valid(const char *s, size_t len);
