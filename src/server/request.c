// Parsing and validation of POST /v1/chat/completions bodies. Every field the server acts on is
// type- and range-checked here so that the rest of the server can trust struct oai_request.
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "server/request.h"
#include "text/chat.h"
#include "util/util.h"

int oai_errorf(struct oai_error *err, int status, const char *type, const char *param,
               const char *fmt, ...) {
    err->status = status;
    err->type = type;
    snprintf(err->param, sizeof err->param, "%s", param ? param : "");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err->msg, sizeof err->msg, fmt, ap);
    va_end(ap);
    return -1;
}

#define BAD(param, ...) oai_errorf(err, 400, "invalid_request_error", param, __VA_ARGS__)

bool utf8_valid(const char *str, size_t len) {
    const unsigned char *s = (const unsigned char *)str;
    size_t i = 0;
    while (i < len) {
        unsigned c = s[i];
        if (c < 0x80) {
            i++;
            continue;
        }
        int n;
        unsigned cp;
        if (c >= 0xc2 && c <= 0xdf)
            n = 1, cp = c & 0x1f;
        else if (c >= 0xe0 && c <= 0xef)
            n = 2, cp = c & 0x0f;
        else if (c >= 0xf0 && c <= 0xf4)
            n = 3, cp = c & 0x07;
        else
            return false;
        if (len - i <= (size_t)n) return false;
        for (int k = 1; k <= n; k++) {
            if ((s[i + k] & 0xc0) != 0x80) return false;
            cp = (cp << 6) | (s[i + k] & 0x3f);
        }
        if ((n == 2 && cp < 0x800) || (n == 3 && (cp < 0x10000 || cp > 0x10ffff)) ||
            (cp >= 0xd800 && cp <= 0xdfff))
            return false;
        i += (size_t)n + 1;
    }
    return true;
}

// Walks the tree once: bounds string lengths and rejects strings that cJSON decoded from \u
// escapes into something that is not valid UTF-8 (lone surrogates).
static int check_strings(const cJSON *j, const struct oai_limits *lim, struct oai_error *err) {
    for (; j; j = j->next) {
        if (j->string && strlen(j->string) > lim->max_string)
            return BAD("", "a key is longer than %zu bytes", lim->max_string);
        if (cJSON_IsString(j)) {
            size_t n = strlen(j->valuestring);
            if (n > lim->max_string)
                return BAD("", "a string is longer than the limit of %zu bytes", lim->max_string);
            if (!utf8_valid(j->valuestring, n))
                return BAD("", "a string is not valid UTF-8 (lone surrogate escape?)");
        }
        if (j->child && check_strings(j->child, lim, err)) return -1;
    }
    return 0;
}

static int get_bool(const cJSON *root, const char *key, bool *out, struct oai_error *err) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, key);
    if (!v || cJSON_IsNull(v)) return 0;
    if (!cJSON_IsBool(v)) return BAD(key, "'%s' must be a boolean", key);
    *out = cJSON_IsTrue(v);
    return 0;
}

// Reads an optional number in [lo, hi]; returns 1 when present, 0 when absent, -1 on error.
static int get_num(const cJSON *root, const char *key, double lo, double hi, bool integer,
                   double *out, struct oai_error *err) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, key);
    if (!v || cJSON_IsNull(v)) return 0;
    if (!cJSON_IsNumber(v)) return BAD(key, "'%s' must be a number", key);
    double d = v->valuedouble;
    if (!isfinite(d) || d < lo || d > hi)
        return BAD(key, "'%s' must be between %g and %g, got %g", key, lo, hi, d);
    if (integer && d != floor(d)) return BAD(key, "'%s' must be an integer", key);
    *out = d;
    return 1;
}

static int get_float(const cJSON *root, const char *key, double lo, double hi, float *out,
                     unsigned bit, unsigned *set, struct oai_error *err) {
    double d;
    int r = get_num(root, key, lo, hi, false, &d, err);
    if (r > 0) *out = (float)d, *set |= bit;
    return r < 0 ? -1 : 0;
}

static const char *const ROLES[] = {"system", "developer", "user", "assistant", "tool"};

static int check_content(const cJSON *c, int i, struct oai_error *err) {
    if (!c || cJSON_IsNull(c) || cJSON_IsString(c)) return 0;
    if (!cJSON_IsArray(c))
        return BAD("messages", "messages[%d].content must be a string, an array of parts or null",
                   i);
    int k = 0;
    for (const cJSON *p = c->child; p; p = p->next, k++) {
        const cJSON *type = cJSON_GetObjectItemCaseSensitive(p, "type");
        if (!cJSON_IsObject(p) || !cJSON_IsString(type))
            return BAD("messages", "messages[%d].content[%d] must be an object with a 'type'", i,
                       k);
        if (strcmp(type->valuestring, "text"))
            return BAD("messages",
                       "messages[%d].content[%d]: only 'text' parts are supported, got '%s'", i, k,
                       type->valuestring);
        if (!cJSON_IsString(cJSON_GetObjectItemCaseSensitive(p, "text")))
            return BAD("messages", "messages[%d].content[%d].text must be a string", i, k);
    }
    return 0;
}

static int check_tool_calls(const cJSON *tc, int i, struct oai_error *err) {
    if (!tc || cJSON_IsNull(tc)) return 0;
    if (!cJSON_IsArray(tc)) return BAD("messages", "messages[%d].tool_calls must be an array", i);
    for (const cJSON *c = tc->child; c; c = c->next) {
        const cJSON *f = cJSON_GetObjectItemCaseSensitive(c, "function");
        if (!cJSON_IsObject(c) || !cJSON_IsObject(f) ||
            !cJSON_IsString(cJSON_GetObjectItemCaseSensitive(f, "name")))
            return BAD("messages", "messages[%d].tool_calls[]: each needs function.name", i);
        const cJSON *a = cJSON_GetObjectItemCaseSensitive(f, "arguments");
        if (a && !cJSON_IsString(a) && !cJSON_IsObject(a))
            return BAD("messages",
                       "messages[%d].tool_calls[].function.arguments must be a JSON string", i);
    }
    return 0;
}

static int parse_messages(const cJSON *root, const struct oai_limits *lim, struct oai_error *err) {
    const cJSON *m = cJSON_GetObjectItemCaseSensitive(root, "messages");
    if (!m) return BAD("messages", "'messages' is required");
    if (!cJSON_IsArray(m)) return BAD("messages", "'messages' must be an array");
    int n = cJSON_GetArraySize(m);
    if (n == 0) return BAD("messages", "'messages' must not be empty");
    if (n > lim->max_messages)
        return BAD("messages", "too many messages: %d (limit %d)", n, lim->max_messages);
    int i = 0;
    for (const cJSON *msg = m->child; msg; msg = msg->next, i++) {
        if (!cJSON_IsObject(msg)) return BAD("messages", "messages[%d] must be an object", i);
        const cJSON *role = cJSON_GetObjectItemCaseSensitive(msg, "role");
        if (!cJSON_IsString(role)) return BAD("messages", "messages[%d].role must be a string", i);
        bool known = false;
        for (size_t r = 0; r < sizeof ROLES / sizeof *ROLES; r++)
            known |= !strcmp(role->valuestring, ROLES[r]);
        if (!known)
            return BAD("messages", "messages[%d].role: unknown role '%.64s'", i, role->valuestring);
        // OpenAI's newer name for system instructions; the template knows only "system".
        if (!strcmp(role->valuestring, "developer")) cJSON_SetValuestring((cJSON *)role, "system");
        if (check_content(cJSON_GetObjectItemCaseSensitive(msg, "content"), i, err)) return -1;
        const cJSON *rc = cJSON_GetObjectItemCaseSensitive(msg, "reasoning_content");
        if (rc && !cJSON_IsNull(rc) && !cJSON_IsString(rc))
            return BAD("messages", "messages[%d].reasoning_content must be a string", i);
        if (check_tool_calls(cJSON_GetObjectItemCaseSensitive(msg, "tool_calls"), i, err))
            return -1;
    }
    return 0;
}

static int parse_tools(cJSON *root, struct oai_request *r, struct oai_error *err) {
    const cJSON *tools = cJSON_GetObjectItemCaseSensitive(root, "tools");
    if (tools && !cJSON_IsNull(tools)) {
        if (!cJSON_IsArray(tools)) return BAD("tools", "'tools' must be an array");
        for (const cJSON *t = tools->child; t; t = t->next) {
            const cJSON *type = cJSON_GetObjectItemCaseSensitive(t, "type");
            const cJSON *f = cJSON_GetObjectItemCaseSensitive(t, "function");
            if (!cJSON_IsObject(t) || !cJSON_IsString(type) ||
                strcmp(type->valuestring, "function"))
                return BAD("tools", "each tool must be {\"type\": \"function\", ...}");
            if (!cJSON_IsObject(f) || !cJSON_IsString(cJSON_GetObjectItemCaseSensitive(f, "name")))
                return BAD("tools", "each tool needs function.name (a string)");
            const cJSON *p = cJSON_GetObjectItemCaseSensitive(f, "parameters");
            if (p && !cJSON_IsNull(p) && !cJSON_IsObject(p))
                return BAD("tools", "function.parameters must be a JSON schema object");
        }
        if (cJSON_GetArraySize(tools) > 0) r->tools = tools;
    }
    const cJSON *tc = cJSON_GetObjectItemCaseSensitive(root, "tool_choice");
    if (!tc || cJSON_IsNull(tc)) return 0;
    if (cJSON_IsString(tc)) {
        if (!strcmp(tc->valuestring, "auto"))
            r->tool_choice = TOOL_CHOICE_AUTO;
        else if (!strcmp(tc->valuestring, "none"))
            r->tool_choice = TOOL_CHOICE_NONE;
        else if (!strcmp(tc->valuestring, "required"))
            r->tool_choice = TOOL_CHOICE_REQUIRED;
        else
            return BAD("tool_choice", "'tool_choice' must be auto, none, required or an object");
    } else if (cJSON_IsObject(tc)) {
        const cJSON *f = cJSON_GetObjectItemCaseSensitive(tc, "function");
        const cJSON *name = cJSON_IsObject(f) ? cJSON_GetObjectItemCaseSensitive(f, "name") : NULL;
        if (!cJSON_IsString(name))
            return BAD("tool_choice", "'tool_choice' object needs function.name");
        r->tool_choice = TOOL_CHOICE_NAMED;
        r->tool_name = xstrdup(name->valuestring);
    } else {
        return BAD("tool_choice", "'tool_choice' must be a string or an object");
    }
    if (r->tool_choice == TOOL_CHOICE_NONE) {
        // The model is told about no tools, so it cannot call one.
        cJSON_DeleteItemFromObjectCaseSensitive(root, "tools");
        r->tools = NULL;
        return 0;
    }
    if (r->tool_choice != TOOL_CHOICE_AUTO && !r->tools)
        return BAD("tool_choice", "'tool_choice' requires 'tools'");
    if (r->tool_choice == TOOL_CHOICE_NAMED) {
        bool found = false;
        for (const cJSON *t = r->tools->child; t; t = t->next) {
            const cJSON *f = cJSON_GetObjectItemCaseSensitive(t, "function");
            found |=
                !strcmp(cJSON_GetObjectItemCaseSensitive(f, "name")->valuestring, r->tool_name);
        }
        if (!found)
            return BAD("tool_choice", "tool_choice names '%.64s', which is not in 'tools'",
                       r->tool_name);
    }
    return 0;
}

static int parse_stop(const cJSON *root, struct oai_request *r, struct oai_error *err) {
    const cJSON *s = cJSON_GetObjectItemCaseSensitive(root, "stop");
    if (!s || cJSON_IsNull(s)) return 0;
    const cJSON *one = cJSON_IsString(s) ? s : NULL;
    if (!one && !cJSON_IsArray(s)) return BAD("stop", "'stop' must be a string or an array");
    if (!one && cJSON_GetArraySize(s) > OAI_MAX_STOP)
        return BAD("stop", "at most %d stop sequences", OAI_MAX_STOP);
    for (const cJSON *it = one ? one : s->child; it; it = one ? NULL : it->next) {
        if (!cJSON_IsString(it)) return BAD("stop", "stop sequences must be strings");
        size_t n = strlen(it->valuestring);
        if (n == 0) continue;
        if (n > OAI_MAX_STOP_LEN)
            return BAD("stop", "a stop sequence is longer than %d bytes", OAI_MAX_STOP_LEN);
        r->stop[r->n_stop++] = xstrdup(it->valuestring);
    }
    return 0;
}

// Fields accepted but not acted on, and fields rejected when set to anything but their default.
static int check_unsupported(const cJSON *root, struct oai_error *err) {
    double n;
    int has_n = get_num(root, "n", 1, 1e9, true, &n, err);
    if (has_n < 0) return -1;
    if (has_n && n != 1) return BAD("n", "only n=1 is supported");
    const cJSON *rf = cJSON_GetObjectItemCaseSensitive(root, "response_format");
    if (rf && !cJSON_IsNull(rf)) {
        const cJSON *t = cJSON_GetObjectItemCaseSensitive(rf, "type");
        if (!cJSON_IsObject(rf) || !cJSON_IsString(t) || strcmp(t->valuestring, "text"))
            return BAD("response_format", "only response_format {\"type\": \"text\"} is supported");
    }
    const cJSON *lb = cJSON_GetObjectItemCaseSensitive(root, "logit_bias");
    if (lb && !cJSON_IsNull(lb) && (!cJSON_IsObject(lb) || lb->child))
        return BAD("logit_bias", "'logit_bias' is not supported");
    const cJSON *pm = cJSON_GetObjectItemCaseSensitive(root, "audio");
    if (pm && !cJSON_IsNull(pm)) return BAD("audio", "audio output is not supported");
    const cJSON *md = cJSON_GetObjectItemCaseSensitive(root, "model");
    if (md && !cJSON_IsNull(md) && !cJSON_IsString(md))
        return BAD("model", "'model' must be a string");
    return 0;
}

static int parse_fields(cJSON *root, const struct oai_limits *lim, bool allow_replay,
                        struct oai_request *r, struct oai_error *err) {
    if (parse_messages(root, lim, err) || check_unsupported(root, err)) return -1;
    if (get_bool(root, "stream", &r->stream, err)) return -1;
    const cJSON *so = cJSON_GetObjectItemCaseSensitive(root, "stream_options");
    if (so && !cJSON_IsNull(so)) {
        if (!cJSON_IsObject(so)) return BAD("stream_options", "'stream_options' must be an object");
        if (get_bool(so, "include_usage", &r->include_usage, err)) return -1;
    }
    double d;
    int got;
    // max_completion_tokens is the newer name; it wins when both are given.
    const char *mt[] = {"max_tokens", "max_completion_tokens"};
    for (int i = 0; i < 2; i++) {
        if ((got = get_num(root, mt[i], 1, 1 << 30, true, &d, err)) < 0) return -1;
        if (got) r->max_tokens = (int)d;
    }
    if (get_float(root, "temperature", 0, 2, &r->sampling.temperature, SAMPLER_SET_TEMPERATURE,
                  &r->set, err) ||
        get_float(root, "top_p", 0, 1, &r->sampling.top_p, SAMPLER_SET_TOP_P, &r->set, err) ||
        get_float(root, "min_p", 0, 1, &r->sampling.min_p, SAMPLER_SET_MIN_P, &r->set, err) ||
        get_float(root, "presence_penalty", -2, 2, &r->sampling.presence_penalty,
                  SAMPLER_SET_PRESENCE, &r->set, err) ||
        get_float(root, "frequency_penalty", -2, 2, &r->sampling.frequency_penalty,
                  SAMPLER_SET_FREQUENCY, &r->set, err) ||
        get_float(root, "repetition_penalty", 0.01, 10, &r->sampling.repetition_penalty,
                  SAMPLER_SET_REPETITION, &r->set, err))
        return -1;
    if ((got = get_num(root, "top_k", -1, 1 << 30, true, &d, err)) < 0) return -1;
    if (got) r->sampling.top_k = (int)d, r->set |= SAMPLER_SET_TOP_K;
    // Seeds are integers; JSON numbers beyond 2^53 lose precision, which is the client's choice.
    if ((got = get_num(root, "seed", -9.2e18, 1.8e19, true, &d, err)) < 0) return -1;
    if (got)
        r->sampling.seed = d < 0 ? (uint64_t)(int64_t)d : (uint64_t)d, r->set |= SAMPLER_SET_SEED;
    if (parse_stop(root, r, err) || parse_tools(root, r, err)) return -1;
    const cJSON *kw = cJSON_GetObjectItemCaseSensitive(root, "chat_template_kwargs");
    if (kw && !cJSON_IsNull(kw)) {
        if (!cJSON_IsObject(kw))
            return BAD("chat_template_kwargs", "'chat_template_kwargs' must be an object");
        if (get_bool(kw, "enable_thinking", &r->enable_thinking, err)) return -1;
        bool pt = false;
        if (get_bool(kw, "preserve_thinking", &pt, err)) return -1;
    }
    if (get_bool(root, "logprobs", &r->logprobs, err)) return -1;
    if ((got = get_num(root, "top_logprobs", 0, 20, true, &d, err)) < 0) return -1;
    if (got) {
        if (!r->logprobs) return BAD("top_logprobs", "'top_logprobs' requires 'logprobs': true");
        r->top_logprobs = (int)d;
    }
    const cJSON *rp = cJSON_GetObjectItemCaseSensitive(root, "wren_replay");
    if (rp) {
        if (!allow_replay)
            return BAD("wren_replay", "'wren_replay' is a test-only field (server not started "
                                      "with --test-replay)");
        if (!cJSON_IsString(rp)) return BAD("wren_replay", "'wren_replay' must be a string");
        r->replay = xstrdup(rp->valuestring);
    }
    return 0;
}

int oai_request_parse(const char *body, size_t len, const struct oai_limits *lim, bool allow_replay,
                      struct oai_request *r, struct oai_error *err) {
    memset(r, 0, sizeof *r);
    r->enable_thinking = true;
    r->top_logprobs = 0;
    if (!utf8_valid(body, len)) return BAD("", "the request body is not valid UTF-8");
    // Parsed the way chat_render needs it (numbers keep their spelling, as Python's json does).
    struct wren_err e;
    r->root = chat_request_parse(body, len, &e);
    if (!r->root) return BAD("", "malformed JSON: %s", e.msg);
    if (!cJSON_IsObject(r->root)) {
        oai_request_free(r);
        return BAD("", "the request body must be a JSON object");
    }
    if (check_strings(r->root->child, lim, err) ||
        parse_fields(r->root, lim, allow_replay, r, err)) {
        oai_request_free(r);
        return -1;
    }
    return 0;
}

void oai_request_free(struct oai_request *r) {
    cJSON_Delete(r->root);
    for (int i = 0; i < r->n_stop; i++) free(r->stop[i]);
    free(r->tool_name);
    free(r->replay);
    memset(r, 0, sizeof *r);
}
