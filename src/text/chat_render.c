// chat_render: the official Qwen3.5/3.6 Jinja chat templates (data/chat_templates/*.jinja),
// transliterated to C statement by statement so that the output and the order in which errors
// are raised match jinja2's rendering (HF settings: trim_blocks, lstrip_blocks, tojson =
// json.dumps(ensure_ascii=False)). Values are handled with Python's semantics for the JSON types
// (truthiness, `in`, str(), str.strip()); see pyjson.h for numbers.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>
#include <utf8proc.h>

#include "text/chat.h"
#include "util/pyjson.h"
#include "util/strbuf.h"
#include "util/util.h"

static const char TOOLS_HEAD[] =
    "# Tools\n\nYou have access to the following functions:\n\n<tools>";
static const char TOOLS_TAIL[] =
    "\n</tools>\n\nIf you choose to call a function ONLY reply in the following format with NO "
    "suffix:\n\n<tool_call>\n<function=example_function_name>\n<parameter=example_parameter_1>\n"
    "value_1\n</parameter>\n<parameter=example_parameter_2>\nThis is the value for the second "
    "parameter\nthat can span\nmultiple lines\n</parameter>\n</function>\n</tool_call>\n\n"
    "<IMPORTANT>\nReminder:\n- Function calls MUST follow the specified format: an inner "
    "<function=...></function> block must be nested within <tool_call></tool_call> XML tags\n"
    "- Required parameters MUST be specified\n- You may provide optional reasoning for your "
    "function call in natural language BEFORE the function call, but NOT after\n- If there is no "
    "function call available, answer the question like normal with your current knowledge and do "
    "not tell the user about function calls\n</IMPORTANT>";

struct render {
    enum chat_flavor flavor;
    const cJSON *messages;
    bool add_vision_id;
    int image_count, video_count;
    struct wren_err *e;
};

// raise_exception(reason): the template's own words.
static int template_raise(struct render *r, const char *reason) {
    return wren_errf(r->e, "%s", reason);
}

static bool is_str(const cJSON *v, const char *s) {
    return cJSON_IsString(v) && !strcmp(v->valuestring, s);
}

static const cJSON *role_of(const cJSON *m) {
    return pyjson_get(m, "role");
}

// Python's `needle in item` for a content part; -1 (TypeError) when item is not a container.
static int py_in(const cJSON *item, const char *needle, struct render *r) {
    if (cJSON_IsObject(item)) return pyjson_get(item, needle) != NULL;
    if (cJSON_IsString(item)) return strstr(item->valuestring, needle) != NULL;
    if (cJSON_IsArray(item)) {
        for (const cJSON *it = item->child; it; it = it->next)
            if (is_str(it, needle)) return 1;
        return 0;
    }
    return wren_errf(r->e, "content part must be an object (got a %s)",
                     cJSON_IsNumber(item) ? "number"
                     : cJSON_IsNull(item) ? "null"
                                          : "boolean");
}

// The template's render_content macro.
static int render_content(struct render *r, const cJSON *content, bool count, bool is_system,
                          struct strbuf *sb) {
    if (cJSON_IsString(content)) {
        sb_puts(sb, content->valuestring);
        return 0;
    }
    if (!content || cJSON_IsNull(content)) return 0;
    if (!cJSON_IsArray(content)) return template_raise(r, "Unexpected content type.");
    for (const cJSON *item = content->child; item; item = item->next) {
        int a, b;
        if ((a = py_in(item, "image", r)) < 0) return -1;
        if (!a && (a = py_in(item, "image_url", r)) < 0) return -1;
        if (a || is_str(pyjson_get(item, "type"), "image")) {
            if (is_system) return template_raise(r, "System message cannot contain images.");
            if (count) r->image_count++;
            if (r->add_vision_id) sb_printf(sb, "Picture %d: ", r->image_count);
            sb_puts(sb, "<|vision_start|><|image_pad|><|vision_end|>");
            continue;
        }
        if ((b = py_in(item, "video", r)) < 0) return -1;
        if (b || is_str(pyjson_get(item, "type"), "video")) {
            if (is_system) return template_raise(r, "System message cannot contain videos.");
            if (count) r->video_count++;
            if (r->add_vision_id) sb_printf(sb, "Video %d: ", r->video_count);
            sb_puts(sb, "<|vision_start|><|video_pad|><|vision_end|>");
            continue;
        }
        if (!py_in(item, "text", r)) return template_raise(r, "Unexpected item type in content.");
        // item.text: a dict's value (str() of it); a string or list has no such attribute ('').
        if (cJSON_IsObject(item)) pyjson_str(sb, pyjson_get(item, "text"));
    }
    return 0;
}

// Python's str.isspace() for one code point (what str.strip() removes).
static bool py_space(utf8proc_int32_t c) {
    return (c >= 0x09 && c <= 0x0d) || (c >= 0x1c && c <= 0x20) || c == 0x85 || c == 0xa0 ||
           c == 0x1680 || (c >= 0x2000 && c <= 0x200a) || c == 0x2028 || c == 0x2029 ||
           c == 0x202f || c == 0x205f || c == 0x3000;
}

// Python's str.strip() on s[0..*len): returns the new start and updates *len.
static const char *py_strip(const char *s, size_t *len) {
    const utf8proc_uint8_t *u = (const utf8proc_uint8_t *)s;
    size_t a = 0, b = *len;
    while (a < b) {
        utf8proc_int32_t c;
        utf8proc_ssize_t k = utf8proc_iterate(u + a, (utf8proc_ssize_t)(b - a), &c);
        if (k <= 0 || !py_space(c)) break;
        a += (size_t)k;
    }
    while (b > a) {
        size_t k = b - 1;
        while (k > a && (u[k] & 0xC0) == 0x80) k--; // start of the last character
        utf8proc_int32_t c;
        if (utf8proc_iterate(u + k, (utf8proc_ssize_t)(b - k), &c) <= 0 || !py_space(c)) break;
        b = k;
    }
    *len = b - a;
    return s + a;
}

// `render_content(...)|trim` into a fresh malloc'd string (NULL after a raise).
static char *content_trimmed(struct render *r, const cJSON *content, bool count, bool is_system) {
    struct strbuf sb = {0};
    if (render_content(r, content, count, is_system, &sb)) {
        sb_free(&sb);
        return NULL;
    }
    size_t n = sb.len;
    const char *s = py_strip(sb.p ? sb.p : "", &n);
    char *out = xmalloc(n + 1);
    memcpy(out, s, n);
    out[n] = 0;
    sb_free(&sb);
    return out;
}

static bool starts_with(const char *s, const char *p) {
    return !strncmp(s, p, strlen(p));
}
static bool ends_with(const char *s, const char *p) {
    size_t n = strlen(s), k = strlen(p);
    return n >= k && !memcmp(s + n - k, p, k);
}

// The system block: the tool list and instructions, then the user's system message.
static int render_system(struct render *r, const cJSON *tools, struct strbuf *out) {
    const cJSON *m0 = r->messages->child;
    bool has_system = is_str(role_of(m0), "system");
    // `tools and tools is iterable and tools is not mapping`: a list (or, oddly, a string).
    if (py_truthy(tools) && (cJSON_IsArray(tools) || cJSON_IsString(tools))) {
        sb_puts(out, "<|im_start|>system\n");
        sb_puts(out, TOOLS_HEAD);
        if (cJSON_IsArray(tools)) {
            for (const cJSON *t = tools->child; t; t = t->next) {
                sb_putc(out, '\n');
                pyjson_dump(out, t);
            }
        } else { // iterating a string yields its characters
            const utf8proc_uint8_t *u = (const utf8proc_uint8_t *)tools->valuestring;
            utf8proc_ssize_t n = (utf8proc_ssize_t)strlen(tools->valuestring);
            while (n > 0) {
                utf8proc_int32_t c;
                utf8proc_ssize_t k = utf8proc_iterate(u, n, &c);
                if (k <= 0) k = 1;
                char ch[5] = {0};
                memcpy(ch, u, (size_t)k);
                cJSON one = {.type = cJSON_String, .valuestring = ch};
                sb_putc(out, '\n');
                pyjson_dump(out, &one);
                u += k, n -= k;
            }
        }
        sb_puts(out, TOOLS_TAIL);
        if (has_system) {
            char *c = content_trimmed(r, pyjson_get(m0, "content"), false, true);
            if (!c) return -1;
            if (*c) sb_puts(out, "\n\n"), sb_puts(out, c);
            free(c);
        }
        sb_puts(out, "<|im_end|>\n");
    } else if (has_system) {
        char *c = content_trimmed(r, pyjson_get(m0, "content"), false, true);
        if (!c) return -1;
        sb_puts(out, "<|im_start|>system\n");
        sb_puts(out, c);
        sb_puts(out, "<|im_end|>\n");
        free(c);
    }
    return 0;
}

// Index of the last real user query (a user turn that is not only tool responses).
static int last_query_index(struct render *r, int *out) {
    const cJSON *first = r->messages->child;
    int i = cJSON_GetArraySize(r->messages) - 1;
    for (const cJSON *m = first->prev; i >= 0; m = m->prev, i--) { // cJSON: first->prev is last
        if (!is_str(role_of(m), "user")) continue;
        char *c = content_trimmed(r, pyjson_get(m, "content"), false, false);
        if (!c) return -1;
        bool tool_only = starts_with(c, "<tool_response>") && ends_with(c, "</tool_response>");
        free(c);
        if (!tool_only) {
            *out = i;
            return 0;
        }
    }
    return template_raise(r, "No user query found in messages.");
}

// tool_call.arguments as a mapping (*map, NULL for none). OpenAI clients send a JSON string,
// which is parsed first (as vLLM does; null and "" mean no arguments) into *owned.
static int tool_arguments(struct render *r, const cJSON *args, const cJSON **map, cJSON **owned) {
    *map = NULL;
    *owned = NULL;
    if (cJSON_IsNull(args) || (cJSON_IsString(args) && !args->valuestring[0])) return 0;
    if (cJSON_IsString(args)) {
        struct wren_err pe;
        const char *s = args->valuestring;
        if (!(*owned = pyjson_parse(s, strlen(s), PYJSON_NONFINITE, &pe)))
            return wren_errf(r->e, "tool call arguments are not valid JSON: %s", pe.msg);
        args = *owned;
    }
    if (!cJSON_IsObject(args)) {
        cJSON_Delete(*owned);
        *owned = NULL;
        return wren_errf(r->e, "tool call arguments must be a JSON object");
    }
    *map = args;
    return 0;
}

static int render_tool_calls(struct render *r, const cJSON *calls, const char *content,
                             struct strbuf *out) {
    if (!cJSON_IsArray(calls))
        return wren_errf(r->e, "tool_calls must be a list of tool call objects");
    for (const cJSON *item = calls->child; item; item = item->next) {
        const cJSON *fn = pyjson_get(item, "function");
        const cJSON *tc = fn ? fn : item; // `tool_call.function is defined` (even when null)
        const cJSON *name = pyjson_get(tc, "name");
        if (!cJSON_IsString(name))
            return wren_errf(r->e, "every tool call needs a function name (a string)");
        if (item == calls->child) {
            size_t n = strlen(content);
            py_strip(content, &n);
            sb_puts(out, n ? "\n\n<tool_call>\n<function=" : "<tool_call>\n<function=");
        } else {
            sb_puts(out, "\n<tool_call>\n<function=");
        }
        sb_puts(out, name->valuestring);
        sb_puts(out, ">\n");
        const cJSON *args = pyjson_get(tc, "arguments");
        if (args) {
            cJSON *owned;
            const cJSON *map;
            if (tool_arguments(r, args, &map, &owned)) return -1;
            for (const cJSON *a = map ? map->child : NULL; a; a = a->next) {
                sb_puts(out, "<parameter=");
                sb_puts(out, a->string);
                sb_puts(out, ">\n");
                // 3.6: `args_value | string if args_value is string else args_value | tojson`;
                // 3.5: tojson only for mappings and sequences, str() (True, None) otherwise.
                bool json = r->flavor == CHAT_QWEN35 ? cJSON_IsObject(a) || cJSON_IsArray(a)
                                                     : !cJSON_IsString(a);
                if (json)
                    pyjson_dump(out, a);
                else
                    pyjson_str(out, a);
                sb_puts(out, "\n</parameter>\n");
            }
            cJSON_Delete(owned);
        }
        sb_puts(out, "</function>\n</tool_call>");
    }
    return 0;
}

// Python's s.split(sep)[0] / [-1] helpers on NUL-terminated text.
static size_t first_part_len(const char *s, const char *sep) {
    const char *f = strstr(s, sep);
    return f ? (size_t)(f - s) : strlen(s);
}
static const char *last_part(const char *s, const char *sep) {
    size_t k = strlen(sep);
    for (const char *f; (f = strstr(s, sep));) s = f + k;
    return s;
}

static int render_assistant(struct render *r, const cJSON *m, char *content, bool keep_thinking,
                            struct strbuf *out) {
    const cJSON *rc = pyjson_get(m, "reasoning_content");
    struct strbuf reasoning = {0};
    const char *body = content;
    if (cJSON_IsString(rc)) {
        sb_puts(&reasoning, rc->valuestring);
    } else if (strstr(content, "</think>")) {
        // content.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n')
        size_t n = first_part_len(content, "</think>");
        while (n && content[n - 1] == '\n') n--;
        char *head = xmalloc(n + 1);
        memcpy(head, content, n);
        head[n] = 0;
        const char *t = last_part(head, "<think>");
        while (*t == '\n') t++;
        sb_puts(&reasoning, t);
        free(head);
        // content.split('</think>')[-1].lstrip('\n')
        body = last_part(content, "</think>");
        while (*body == '\n') body++;
    }
    size_t rn = reasoning.len;
    const char *rs = py_strip(reasoning.p ? reasoning.p : "", &rn);
    if (keep_thinking) {
        sb_puts(out, "<|im_start|>assistant\n<think>\n");
        sb_put(out, rs, rn);
        sb_puts(out, "\n</think>\n\n");
        sb_puts(out, body);
    } else {
        sb_puts(out, "<|im_start|>assistant\n");
        sb_puts(out, body);
    }
    sb_free(&reasoning);
    const cJSON *calls = pyjson_get(m, "tool_calls");
    // `tool_calls and tool_calls is iterable and tool_calls is not mapping`
    if (py_truthy(calls) && (cJSON_IsArray(calls) || cJSON_IsString(calls)))
        if (render_tool_calls(r, calls, body, out)) return -1;
    sb_puts(out, "<|im_end|>\n");
    return 0;
}

static int render_messages(struct render *r, const cJSON *kwargs, struct strbuf *out) {
    int last_query = 0;
    if (last_query_index(r, &last_query)) return -1;
    bool preserve =
        r->flavor == CHAT_QWEN36 && cJSON_IsTrue(pyjson_get(kwargs, "preserve_thinking"));
    int i = 0;
    for (const cJSON *m = r->messages->child; m; m = m->next, i++) {
        char *content = content_trimmed(r, pyjson_get(m, "content"), true, false);
        if (!content) return -1;
        const cJSON *role = role_of(m);
        int rc = 0;
        if (is_str(role, "system")) {
            if (i != 0) rc = template_raise(r, "System message must be at the beginning.");
        } else if (is_str(role, "user")) {
            sb_puts(out, "<|im_start|>user\n");
            sb_puts(out, content);
            sb_puts(out, "<|im_end|>\n");
        } else if (is_str(role, "assistant")) {
            rc = render_assistant(r, m, content, preserve || i > last_query, out);
        } else if (is_str(role, "tool")) {
            if (m->prev && i > 0 && !is_str(role_of(m->prev), "tool"))
                sb_puts(out, "<|im_start|>user");
            sb_puts(out, "\n<tool_response>\n");
            sb_puts(out, content);
            sb_puts(out, "\n</tool_response>");
            if (!m->next || !is_str(role_of(m->next), "tool")) sb_puts(out, "<|im_end|>\n");
        } else {
            rc = template_raise(r, "Unexpected message role.");
        }
        free(content);
        if (rc) return -1;
    }
    return 0;
}

int chat_render(const cJSON *request, enum chat_flavor flavor, bool add_generation_prompt,
                char **out, struct wren_err *e) {
    *out = NULL;
    const cJSON *kwargs = pyjson_get(request, "chat_template_kwargs");
    struct render r = {.flavor = flavor, .messages = pyjson_get(request, "messages"), .e = e};
    r.add_vision_id = py_truthy(pyjson_get(kwargs, "add_vision_id"));
    if (!py_truthy(r.messages)) return template_raise(&r, "No messages provided.");
    if (!cJSON_IsArray(r.messages))
        return wren_errf(e, "messages must be a list of message objects");
    struct strbuf sb = {0};
    if (render_system(&r, pyjson_get(request, "tools"), &sb) || render_messages(&r, kwargs, &sb)) {
        sb_free(&sb);
        return -1;
    }
    if (add_generation_prompt) {
        sb_puts(&sb, "<|im_start|>assistant\n");
        const cJSON *think = pyjson_get(kwargs, "enable_thinking");
        sb_puts(&sb, cJSON_IsFalse(think) ? "<think>\n\n</think>\n\n" : "<think>\n");
    }
    *out = sb_take(&sb);
    return 0;
}

cJSON *chat_request_parse(const char *text, size_t len, struct wren_err *e) {
    return pyjson_parse(text, len, PYJSON_NONFINITE, e);
}
