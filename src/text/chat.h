// The Qwen3.5/3.6 chat format: rendering OpenAI-style requests into the prompt exactly as the
// official Jinja templates do, and splitting the model's output into reasoning, content and tool
// calls.
#pragma once
#include <stdbool.h>
#include <stddef.h>

#include "util/err.h"

struct cJSON;

enum chat_flavor { CHAT_QWEN36, CHAT_QWEN35 };

// Picks the flavor from a checkpoint's chat template (chat_template.jinja or
// tokenizer_config.json in dir); Qwen3.6 when dir is NULL or has no template.
enum chat_flavor chat_flavor_detect(const char *dir);

// Parses a request body for chat_render. Like cJSON_Parse, but numbers keep their spelling (1 vs
// 1.0, see util/pyjson.h) so that tojson output matches Python's exactly; a tree from plain
// cJSON_Parse also works, with integral floats then written as ints. NULL + e when invalid.
struct cJSON *chat_request_parse(const char *text, size_t len, struct wren_err *e);

// Renders request fields `messages`, `tools`, `chat_template_kwargs` (enable_thinking,
// preserve_thinking, add_vision_id) into the prompt text (malloc'd), with the generation prompt
// when asked, byte for byte as jinja2 renders the official template. Tool call `arguments` may
// be objects or JSON strings (parsed first, as vLLM does; null or "" = no arguments).
// A conversation the official template rejects is an error with the template's reason
// ("System message must be at the beginning.", ...).
int chat_render(const struct cJSON *request, enum chat_flavor flavor, bool add_generation_prompt,
                char **out, struct wren_err *e);

// Incremental parser of generated text. The prompt ends inside <think> (thinking on) or after
// the empty think block; text up to </think> is reasoning, the rest content, and
// <tool_call>...</tool_call> blocks become tool calls with JSON arguments typed by the tools'
// schemas (see text/chat_toolcall.h for the typing rules). Partial tags are held back until
// they can be classified, so the events do not depend on how the text is chunked.
// Stripped, because the template writes them around tags: '\n's at the start of the reasoning,
// of the content and after each </tool_call>, and '\n's right before </think> and <tool_call>.
// Nothing else is changed (other whitespace, trailing '\n's at the end of the reply stay).
// Only </think> is recognised in reasoning and only <tool_call> in content. A malformed block
// (no <function=NAME>), an unterminated one at finish, or one over 1 MiB is content, verbatim.
enum chat_event_kind { CHAT_REASONING, CHAT_CONTENT, CHAT_TOOL_CALL };
struct chat_event {
    enum chat_event_kind kind;
    const char *text; // REASONING/CONTENT: the new text (len bytes)
    size_t len;
    int tool_index;        // TOOL_CALL: index of the call in this reply
    const char *tool_name; // TOOL_CALL: function name
    const char *arguments; // TOOL_CALL: complete JSON arguments object
};
typedef void (*chat_event_cb)(void *ud, const struct chat_event *ev);

struct chat_parser;
// tools: the request's `tools` array (may be NULL; copied). in_reasoning: the prompt ended with
// <think>\n (see chat_prompt_in_reasoning). Events go to cb during feed/finish; their text is
// valid only during the call. Memory stays bounded whatever the input.
struct chat_parser *chat_parser_new(const struct cJSON *tools, bool in_reasoning);
// True when a rendered prompt leaves the model inside the think block (ends with "<think>\n").
bool chat_prompt_in_reasoning(const char *prompt);
void chat_parser_free(struct chat_parser *p);
void chat_parser_feed(struct chat_parser *p, const char *text, size_t len, chat_event_cb cb,
                      void *ud);
// End of generation: flushes held text (an unterminated tool call becomes content).
void chat_parser_finish(struct chat_parser *p, chat_event_cb cb, void *ud);
