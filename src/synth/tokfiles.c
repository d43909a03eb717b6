// --tokenizer DIR: the vocabulary must cover every id tokenizer.json can produce, and the config
// must name the tokenizer's own special ids; the tokenizer files travel with the checkpoint.
#include <errno.h>
#include <fcntl.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "synth/synth.h"
#include "util/util.h"

static int id_of(const cJSON *item, int *out) {
    if (!cJSON_IsNumber(item)) return -1;
    double v = item->valuedouble;
    if (v < 0 || v > 2147483647.0 || v != (double)(int)v) return -1;
    *out = (int)v;
    return 0;
}

static void note_special(struct synth_tokenizer *tk, const char *content, int id) {
    static const struct {
        const char *text;
        size_t field;
    } specials[] = {
        {"<|endoftext|>", offsetof(struct synth_tokenizer, endoftext)},
        {"<|im_end|>", offsetof(struct synth_tokenizer, im_end)},
        {"<|vision_start|>", offsetof(struct synth_tokenizer, vision_start)},
        {"<|vision_end|>", offsetof(struct synth_tokenizer, vision_end)},
        {"<|image_pad|>", offsetof(struct synth_tokenizer, image_pad)},
        {"<|video_pad|>", offsetof(struct synth_tokenizer, video_pad)},
    };
    for (size_t i = 0; i < sizeof specials / sizeof specials[0]; i++)
        if (!strcmp(content, specials[i].text)) *(int *)((char *)tk + specials[i].field) = id;
}

int synth_tokenizer_read(const char *src_dir, struct synth_tokenizer *tk, struct wren_err *e) {
    memset(tk, 0, sizeof *tk);
    tk->endoftext = tk->im_end = tk->vision_start = tk->vision_end = -1;
    tk->image_pad = tk->video_pad = -1;
    char path[4096];
    struct stat st;
    snprintf(path, sizeof path, "%s/tokenizer_config.json", src_dir);
    if (stat(path, &st))
        return wren_errf(e, "tokenizer directory %s has no tokenizer_config.json", src_dir);
    snprintf(path, sizeof path, "%s/tokenizer.json", src_dir);
    size_t len;
    char *text = read_file(path, &len, e);
    if (!text) return -1;
    cJSON *root = cJSON_ParseWithLength(text, len);
    free(text);
    if (!root) return wren_errf(e, "%s: not valid JSON", path);
    int max_id = -1, rc = 0;
    const cJSON *vocab =
        cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(root, "model"), "vocab");
    if (!cJSON_IsObject(vocab)) {
        rc = wren_errf(e, "%s: no model.vocab object (not a BPE tokenizer.json?)", path);
        goto done;
    }
    for (const cJSON *it = vocab->child; it; it = it->next) {
        int id;
        if (id_of(it, &id)) {
            rc = wren_errf(e, "%s: model.vocab entry '%s' is not a token id", path, it->string);
            goto done;
        }
        if (id > max_id) max_id = id;
        note_special(tk, it->string, id);
    }
    const cJSON *added = cJSON_GetObjectItemCaseSensitive(root, "added_tokens");
    if (added && !cJSON_IsArray(added)) {
        rc = wren_errf(e, "%s: added_tokens is not an array", path);
        goto done;
    }
    for (const cJSON *it = added ? added->child : NULL; it; it = it->next) {
        const cJSON *content = cJSON_GetObjectItemCaseSensitive(it, "content");
        int id;
        if (id_of(cJSON_GetObjectItemCaseSensitive(it, "id"), &id) || !cJSON_IsString(content)) {
            rc = wren_errf(e, "%s: an added_tokens entry lacks an id or content", path);
            goto done;
        }
        if (id > max_id) max_id = id;
        note_special(tk, content->valuestring, id);
    }
    if (max_id < 0) {
        rc = wren_errf(e, "%s: the vocabulary is empty", path);
        goto done;
    }
    if (tk->endoftext < 0) {
        rc = wren_errf(e, "%s: no <|endoftext|> token (needed for eos_token_id)", path);
        goto done;
    }
    tk->n_ids = max_id + 1;
done:
    cJSON_Delete(root);
    return rc;
}

static int copy_file(const char *src, const char *dst, struct wren_err *e) {
    size_t len;
    char *data = read_file(src, &len, e);
    if (!data) return -1;
    int fd = open(dst, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
        free(data);
        return wren_errf(e, "cannot create %s: %s", dst, strerror(errno));
    }
    int rc = st_pwrite_all(fd, data, len, 0, dst, e);
    free(data);
    if (close(fd) && !rc) rc = wren_errf(e, "closing %s: %s", dst, strerror(errno));
    return rc;
}

int synth_tokenizer_copy(const char *src_dir, const char *dst_dir, struct synth_tokenizer *tk,
                         struct wren_err *e) {
    static const struct {
        const char *name;
        bool required;
    } files[] = {{"tokenizer.json", true},
                 {"tokenizer_config.json", true},
                 {"chat_template.jinja", false},
                 {"generation_config.json", false}};
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        char src[4096], dst[4096];
        snprintf(src, sizeof src, "%s/%s", src_dir, files[i].name);
        snprintf(dst, sizeof dst, "%s/%s", dst_dir, files[i].name);
        struct stat st;
        if (stat(src, &st)) {
            if (files[i].required)
                return wren_errf(e, "tokenizer directory %s has no %s", src_dir, files[i].name);
            continue;
        }
        if (copy_file(src, dst, e)) return -1;
        if (!strcmp(files[i].name, "generation_config.json")) tk->has_generation_config = true;
    }
    return 0;
}
