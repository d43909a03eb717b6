// One Qwen3-Coder style tool call block, as the model writes it between <tool_call> and
// </tool_call>, turned into a function name and JSON arguments typed by the tool's schema.
#pragma once
#include <stddef.h>

struct cJSON;

// body: the text between the tags (any bytes). tools: the request's `tools` (may be NULL).
// Returns 0 with *name and *arguments (a JSON object's text) malloc'd, or -1 when the block has
// no <function=NAME>. Parameter values lose one leading and one trailing '\n' (the template
// writes '\n' + value + '\n'). A value whose schema allows strings (or an enum of strings) stays
// a string; otherwise, and for parameters the schema does not know, it becomes the JSON value
// it spells when it is valid JSON (True/False in any case count as booleans), else a string.
// A parameter given twice keeps the last value. Names and values are cut at a NUL byte and
// invalid UTF-8 bytes become U+FFFD, so the arguments are always valid JSON text.
int chat_toolcall_parse(const char *body, size_t len, const struct cJSON *tools, char **name,
                        char **arguments);
