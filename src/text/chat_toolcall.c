#include "text/chat_toolcall.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <cjson/cJSON.h>

#include "util/pyjson.h"
#include "util/strbuf.h"
#include "util/util.h"

static const char *find(const char *s, const char *end, const char *needle) {
    return memmem(s, (size_t)(end - s), needle, strlen(needle));
}

static bool is_ws(char c) {
    return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}

// Copies s[0..n) trimmed of ASCII whitespace, as valid UTF-8 up to any NUL byte.
static char *dup_trim(const char *s, size_t n) {
    while (n && is_ws(*s)) s++, n--;
    while (n && is_ws(s[n - 1])) n--;
    return utf8_valid_copy(s, n);
}

static const cJSON *tool_parameters(const cJSON *tools, const char *name) {
    const cJSON *t;
    cJSON_ArrayForEach(t, tools) {
        const cJSON *fn = pyjson_get(t, "function");
        if (!fn) fn = t;
        const cJSON *n = pyjson_get(fn, "name");
        if (cJSON_IsString(n) && !strcmp(n->valuestring, name))
            return pyjson_get(pyjson_get(fn, "parameters"), "properties");
    }
    return NULL;
}

static bool type_is_string(const cJSON *type) {
    if (cJSON_IsString(type)) return !strcmp(type->valuestring, "string");
    const cJSON *it;
    cJSON_ArrayForEach(it, type) if (cJSON_IsString(it) &&
                                     !strcmp(it->valuestring, "string")) return true;
    return false;
}

static bool schema_allows_string(const cJSON *schema, int depth) {
    if (!cJSON_IsObject(schema) || depth > 8) return false;
    const cJSON *type = pyjson_get(schema, "type");
    if (type) return type_is_string(type);
    static const char *const unions[] = {"anyOf", "oneOf"};
    for (int k = 0; k < 2; k++) {
        const cJSON *sub;
        cJSON_ArrayForEach(sub, pyjson_get(schema, unions[k])) if (schema_allows_string(
                                                                       sub, depth + 1)) return true;
    }
    const cJSON *en = pyjson_get(schema, "enum"), *it;
    if (!cJSON_IsArray(en) || !en->child) return false;
    cJSON_ArrayForEach(it, en) if (!cJSON_IsString(it)) return false;
    return true;
}

static cJSON *convert(const char *value, const cJSON *schema) {
    if (schema_allows_string(schema, 0)) return cJSON_CreateString(value);
    struct wren_err e;
    cJSON *v = pyjson_parse(value, strlen(value), 0, &e);
    if (v) return v;
    size_t n = strlen(value);
    const char *t = value;
    while (n && is_ws(*t)) t++, n--;
    while (n && is_ws(t[n - 1])) n--;
    if (n == 4 && !strncasecmp(t, "true", 4)) return cJSON_CreateTrue();
    if (n == 5 && !strncasecmp(t, "false", 5)) return cJSON_CreateFalse();
    return cJSON_CreateString(value);
}

int chat_toolcall_parse(const char *body, size_t len, const cJSON *tools, char **name_out,
                        char **args_out) {
    const char *end = body + len;
    const char *f = find(body, end, "<function=");
    if (!f) return -1;
    const char *name_start = f + strlen("<function=");
    const char *name_end = memchr(name_start, '>', (size_t)(end - name_start));
    if (!name_end) return -1;
    char *name = dup_trim(name_start, (size_t)(name_end - name_start));
    if (!*name || strchr(name, '<') || strchr(name, '\n')) {
        free(name);
        return -1;
    }
    const char *fend = find(name_end, end, "</function>");
    if (fend) end = fend;
    const cJSON *props = tool_parameters(tools, name);
    cJSON *args = cJSON_CreateObject();
    for (const char *p = name_end + 1; (p = find(p, end, "<parameter="));) {
        const char *pn = p + strlen("<parameter=");
        const char *pn_end = memchr(pn, '>', (size_t)(end - pn));
        if (!pn_end) break;
        const char *v = pn_end + 1;
        // The value ends at </parameter>, or (when the model forgot it) at the next parameter.
        const char *close = find(v, end, "</parameter>"), *next = find(v, end, "<parameter=");
        const char *v_end = close && (!next || close < next) ? close : next ? next : end;
        p = v_end == close ? close + strlen("</parameter>") : v_end;
        if (v < v_end && *v == '\n') v++;
        if (v_end > v && v_end[-1] == '\n') v_end--;
        char *pname = dup_trim(pn, (size_t)(pn_end - pn));
        char *value = utf8_valid_copy(v, (size_t)(v_end - v));
        if (*pname) {
            cJSON_AddItemToObject(args, pname, convert(value, pyjson_get(props, pname)));
        }
        free(pname);
        free(value);
    }
    pyjson_dedupe_keys(args);
    struct strbuf sb = {0};
    pyjson_dump_verbatim(&sb, args);
    cJSON_Delete(args);
    *name_out = name;
    *args_out = sb_take(&sb);
    return 0;
}
