// Response JSON in the OpenAI chat-completions schema: errors, chunks, usage, tool calls,
// logprobs and the model list.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cjson/cJSON.h>

#include "server/internal.h"
#include "text/tokenizer.h"
#include "util/util.h"

char *oai_error_body(const struct oai_error *err) {
    cJSON *root = cJSON_CreateObject(), *e = cJSON_AddObjectToObject(root, "error");
    cJSON_AddStringToObject(e, "message", err->msg);
    cJSON_AddStringToObject(e, "type", err->type ? err->type : "invalid_request_error");
    if (err->param[0])
        cJSON_AddStringToObject(e, "param", err->param);
    else
        cJSON_AddNullToObject(e, "param");
    cJSON_AddNullToObject(e, "code");
    char *s = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    return s;
}

// {id, object, created, model, choices: [{index: 0, delta: {}, logprobs: null,
// finish_reason: null}]}: the caller fills delta / finish_reason.
cJSON *oai_chunk(const struct server *sv, const struct job *j) {
    cJSON *c = cJSON_CreateObject();
    cJSON_AddStringToObject(c, "id", j->id);
    cJSON_AddStringToObject(c, "object", "chat.completion.chunk");
    cJSON_AddNumberToObject(c, "created", (double)j->created);
    cJSON_AddStringToObject(c, "model", sv->model_name);
    cJSON_AddStringToObject(c, "system_fingerprint", "wren");
    cJSON *ch = cJSON_AddArrayToObject(c, "choices"), *c0 = cJSON_CreateObject();
    cJSON_AddItemToArray(ch, c0);
    cJSON_AddNumberToObject(c0, "index", 0);
    cJSON_AddObjectToObject(c0, "delta");
    cJSON_AddNullToObject(c0, "logprobs");
    cJSON_AddNullToObject(c0, "finish_reason");
    return c;
}

cJSON *oai_usage(int n_prompt, int n_completion, int n_cached) {
    cJSON *u = cJSON_CreateObject();
    cJSON_AddNumberToObject(u, "prompt_tokens", n_prompt);
    cJSON_AddNumberToObject(u, "completion_tokens", n_completion);
    cJSON_AddNumberToObject(u, "total_tokens", n_prompt + n_completion);
    cJSON *d = cJSON_AddObjectToObject(u, "prompt_tokens_details");
    cJSON_AddNumberToObject(d, "cached_tokens", n_cached);
    return u;
}

cJSON *oai_tool_call(int index, const char *id, const char *name, const char *args) {
    cJSON *t = cJSON_CreateObject();
    if (index >= 0) cJSON_AddNumberToObject(t, "index", index);
    cJSON_AddStringToObject(t, "id", id);
    cJSON_AddStringToObject(t, "type", "function");
    cJSON *f = cJSON_AddObjectToObject(t, "function");
    cJSON_AddStringToObject(f, "name", name);
    cJSON_AddStringToObject(f, "arguments", args);
    return t;
}

// A token's text for logprobs: its bytes, as text when they are valid UTF-8 on their own (a
// token may hold part of a character; `bytes` then carries the exact value, as OpenAI does).
static void add_token(cJSON *o, const struct tokenizer *t, int32_t id, float logprob) {
    size_t n = 0;
    const char *b = tokenizer_token_bytes(t, id, &n);
    if (!b) b = "", n = 0;
    char *text = xmalloc(n + 1);
    memcpy(text, b, n);
    text[n] = 0;
    cJSON_AddStringToObject(o, "token",
                            utf8_valid(text, n) && strlen(text) == n ? text : "\xef\xbf\xbd");
    free(text);
    cJSON_AddNumberToObject(o, "logprob", logprob);
    cJSON *bytes = cJSON_AddArrayToObject(o, "bytes");
    for (size_t i = 0; i < n; i++)
        cJSON_AddItemToArray(bytes, cJSON_CreateNumber((unsigned char)b[i]));
}

cJSON *oai_logprob(const struct tokenizer *t, const struct sampled_token *st) {
    cJSON *o = cJSON_CreateObject();
    add_token(o, t, st->id, st->logprob);
    cJSON *top = cJSON_AddArrayToObject(o, "top_logprobs");
    for (int i = 0; i < st->n_top && i < WREN_MAX_TOP_LOGPROBS; i++) {
        cJSON *e = cJSON_CreateObject();
        add_token(e, t, st->top_id[i], st->top_logprob[i]);
        cJSON_AddItemToArray(top, e);
    }
    return o;
}

char *oai_models_body(const struct server *sv) {
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "object", "list");
    cJSON *data = cJSON_AddArrayToObject(root, "data"), *m = cJSON_CreateObject();
    cJSON_AddItemToArray(data, m);
    cJSON_AddStringToObject(m, "id", sv->model_name);
    cJSON_AddStringToObject(m, "object", "model");
    cJSON_AddNumberToObject(m, "created", 0);
    cJSON_AddStringToObject(m, "owned_by", "wren");
    cJSON_AddNumberToObject(m, "max_model_len", sv->n_ctx);
    char *s = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    return s;
}
