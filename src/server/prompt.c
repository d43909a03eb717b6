// Request -> prompt tokens, done in the connection's thread before the request is queued, so
// that template errors and context overflows are answered at once with a 400.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cjson/cJSON.h>

#include "server/internal.h"
#include "text/chat.h"
#include "text/tokenizer.h"
#include "util/util.h"

static void make_id(struct job *j) {
    static atomic_uint_fast64_t counter;
    uint64_t n = atomic_fetch_add(&counter, 1);
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    snprintf(j->id, sizeof j->id, "chatcmpl-%lx%06llx", (long)ts.tv_sec,
             (unsigned long long)(n & 0xffffff));
    j->created = (long)ts.tv_sec;
}

int prepare_prompt(struct server *sv, struct job *j, struct oai_error *err) {
    make_id(j);
    struct wren_err e = {0};
    char *text = NULL;
    if (chat_render(j->req.root, (enum chat_flavor)sv->chat_flavor, true, &text, &e))
        return oai_errorf(err, 400, "invalid_request_error", "messages", "%s", e.msg);
    size_t len = strlen(text);
    j->in_reasoning = chat_prompt_in_reasoning(text);
    int n = tokenizer_encode(sv->tok, text, len, &j->prompt, &e);
    free(text);
    if (n < 0) return oai_errorf(err, 400, "invalid_request_error", "messages", "%s", e.msg);
    j->n_prompt = n;
    int limit = sv->o.max_prompt_tokens;
    if (limit > 0 && n > limit)
        return oai_errorf(
            err, 400, "invalid_request_error", "messages",
            "the prompt is %d tokens, more than the limit of %d (--max-prompt-tokens)", n, limit);
    if (n + 1 > sv->n_ctx)
        return oai_errorf(err, 400, "invalid_request_error", "messages",
                          "This model's maximum context length is %d tokens; the prompt is %d "
                          "tokens, leaving no room to generate (context_length_exceeded)",
                          sv->n_ctx, n);
    j->turn_start = 0;
    for (int i = n - 1; i >= 0; i--)
        if (j->prompt[i] == sv->im_start) {
            j->turn_start = i;
            break;
        }
    return 0;
}
