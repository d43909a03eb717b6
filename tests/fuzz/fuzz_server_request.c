// libFuzzer target: the chat-completions request parser (JSON -> struct oai_request) on
// arbitrary bytes. It must never crash, leak or read out of bounds, and must either accept the
// input or explain why with a 400.
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include <cjson/cJSON.h>

#include "server/request.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    struct oai_limits lim = {.max_messages = 64, .max_string = 1 << 16};
    struct oai_request r;
    struct oai_error err;
    if (oai_request_parse((const char *)data, size, &lim, size % 2, &r, &err) == 0) {
        // What the rest of the server relies on.
        if (!cJSON_IsObject(r.root) || r.n_stop > OAI_MAX_STOP || r.top_logprobs > 20) abort();
        if (r.tool_choice == TOOL_CHOICE_NAMED && !r.tool_name) abort();
        oai_request_free(&r);
    } else if (err.status != 400 || !err.msg[0]) {
        abort();
    }
    return 0;
}
