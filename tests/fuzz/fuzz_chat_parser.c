// libFuzzer target: the chat output parser. Byte 0 picks the mode and a chunk size; the rest is
// generated text. Besides not crashing, the events must not depend on the chunking and every
// tool call's arguments must be a JSON object.
#include <stdint.h>

#include "../chat_events.h"

static cJSON *tools;

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!size) return 0;
    if (!tools)
        tools = cJSON_Parse(
            "[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":{\"properties\":"
            "{\"s\":{\"type\":\"string\"},\"n\":{\"type\":\"integer\"},\"b\":{\"type\":"
            "\"boolean\"},\"o\":{\"anyOf\":[{\"type\":\"object\"},{\"enum\":[\"a\"]}]}}}}}]");
    bool in_reasoning = data[0] & 1;
    size_t chunk = 1 + (data[0] >> 1);
    const char *text = (const char *)data + 1;
    struct collected whole = {0}, parts = {0};
    parse_chunked(tools, in_reasoning, text, size - 1, NULL, 0, &whole);
    parse_chunked(tools, in_reasoning, text, size - 1, &chunk, 1, &parts);
    if (!collected_equal(&whole, &parts) || whole.bad_arguments) __builtin_trap();
    collected_free(&whole);
    collected_free(&parts);
    return 0;
}
