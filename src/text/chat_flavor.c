// chat_flavor_detect: which of the two official templates a checkpoint ships. They differ in
// two lines; Qwen3.6's mentions preserve_thinking, Qwen3.5's renders only mappings and
// sequences of tool arguments with tojson.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "text/chat.h"
#include "util/util.h"

static enum chat_flavor from_text(const char *t, enum chat_flavor dflt) {
    if (!t) return dflt;
    if (strstr(t, "preserve_thinking")) return CHAT_QWEN36;
    if (strstr(t, "args_value is mapping or (args_value is sequence")) return CHAT_QWEN35;
    return dflt;
}

// tokenizer_config.json's chat_template: a string, or a list of {name, template} (HF), where
// the one named "default" is the chat template.
static const char *config_template(const cJSON *cfg) {
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(cfg, "chat_template");
    if (cJSON_IsString(t)) return t->valuestring;
    const cJSON *it;
    cJSON_ArrayForEach(it, t) {
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(it, "name");
        const cJSON *tmpl = cJSON_GetObjectItemCaseSensitive(it, "template");
        if (cJSON_IsString(name) && !strcmp(name->valuestring, "default") && cJSON_IsString(tmpl))
            return tmpl->valuestring;
    }
    return NULL;
}

enum chat_flavor chat_flavor_detect(const char *dir) {
    if (!dir) return CHAT_QWEN36;
    struct wren_err e;
    char path[4096];
    snprintf(path, sizeof path, "%s/chat_template.jinja", dir);
    char *text = read_file(path, NULL, &e);
    if (text) {
        enum chat_flavor f = from_text(text, CHAT_QWEN36);
        free(text);
        return f;
    }
    snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
    size_t len;
    if (!(text = read_file(path, &len, &e))) return CHAT_QWEN36;
    cJSON *cfg = cJSON_ParseWithLength(text, len);
    free(text);
    enum chat_flavor f = from_text(config_template(cfg), CHAT_QWEN36);
    cJSON_Delete(cfg);
    return f;
}
