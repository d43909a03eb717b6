// libFuzzer target: a chat request body through chat_request_parse and chat_render (both
// flavors). Also checks that pyjson writes back what it read: dumping a parsed value verbatim,
// parsing that and dumping it again gives the same text.
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "text/chat.h"
#include "util/pyjson.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    struct wren_err e;
    cJSON *req = chat_request_parse((const char *)data, size, &e);
    if (!req) return 0;
    for (int f = 0; f < 2; f++) {
        char *out = NULL;
        if (!chat_render(req, f ? CHAT_QWEN35 : CHAT_QWEN36, f, &out, &e)) free(out);
    }
    struct strbuf a = {0}, b = {0};
    pyjson_dump_verbatim(&a, req);
    cJSON *again = pyjson_parse(a.p, a.len, PYJSON_NONFINITE, &e);
    if (!again) __builtin_trap();
    pyjson_dump_verbatim(&b, again);
    if (a.len != b.len || memcmp(a.p, b.p, a.len)) __builtin_trap();
    pyjson_dump(&b, again); // the Python spelling too (floats, -0)
    sb_free(&a);
    sb_free(&b);
    cJSON_Delete(again);
    cJSON_Delete(req);
    return 0;
}
