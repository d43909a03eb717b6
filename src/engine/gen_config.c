#include "engine/gen_config.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "text/tokenizer.h"
#include "util/util.h"

// A numeric key within [lo, hi]; absent or JSON null leaves *out unchanged.
static int num(const cJSON *root, const char *key, double lo, double hi, double *out,
               const char *path, struct wren_err *e) {
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(root, key);
    if (!it || cJSON_IsNull(it)) return 0;
    if (!cJSON_IsNumber(it) || !isfinite(it->valuedouble) || it->valuedouble < lo ||
        it->valuedouble > hi)
        return wren_errf(e, "%s: \"%s\" must be a number in [%g, %g]", path, key, lo, hi);
    *out = it->valuedouble;
    return 1;
}

static int eos_ids(const cJSON *root, struct gen_config *gc, const char *path, struct wren_err *e) {
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(root, "eos_token_id");
    if (!it || cJSON_IsNull(it)) return 0;
    const cJSON *one = cJSON_IsArray(it) ? it->child : it;
    for (; one; one = cJSON_IsArray(it) ? one->next : NULL) {
        double d = one->valuedouble;
        if (!cJSON_IsNumber(one) || d < 0 || d > 2147483647.0 || d != floor(d))
            return wren_errf(e, "%s: \"eos_token_id\" must be a token id or a list of them", path);
        if (gc->n_eos == WREN_MAX_EOS)
            return wren_errf(e, "%s: more than %d eos_token_id values", path, WREN_MAX_EOS);
        gc->eos[gc->n_eos++] = (int32_t)d;
    }
    return 0;
}

int gen_config_parse(const char *json, size_t len, const char *path, struct gen_config *gc,
                     struct wren_err *e) {
    memset(gc, 0, sizeof *gc);
    gc->sampling = sampler_defaults();
    cJSON *root = cJSON_ParseWithLength(json, len);
    if (!root || !cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return wren_errf(e, "%s: not a JSON object", path);
    }
    gc->found = true;
    struct sampler_params *p = &gc->sampling;
    double v = 0;
    int r;
    if ((r = num(root, "temperature", 0, 100, &v, path, e)) < 0) goto fail;
    if (r) p->temperature = (float)v;
    if ((r = num(root, "top_k", 0, 1e9, &v, path, e)) < 0) goto fail;
    if (r) p->top_k = (int)v;
    if ((r = num(root, "top_p", 0, 1, &v, path, e)) < 0) goto fail;
    if (r) p->top_p = (float)v;
    if ((r = num(root, "min_p", 0, 1, &v, path, e)) < 0) goto fail;
    if (r) p->min_p = (float)v;
    if ((r = num(root, "repetition_penalty", 1e-6, 100, &v, path, e)) < 0) goto fail;
    if (r) p->repetition_penalty = (float)v;
    // HF semantics: do_sample false means greedy whatever the temperature says. An absent
    // do_sample is taken as "sample" since the file then exists to give sampling values.
    const cJSON *ds = cJSON_GetObjectItemCaseSensitive(root, "do_sample");
    if (ds && !cJSON_IsNull(ds) && !cJSON_IsBool(ds)) {
        wren_errf(e, "%s: \"do_sample\" must be true or false", path);
        goto fail;
    }
    if (cJSON_IsFalse(ds)) p->temperature = 0;
    if (eos_ids(root, gc, path, e)) goto fail;
    cJSON_Delete(root);
    return 0;
fail:
    cJSON_Delete(root);
    return -1;
}

int gen_config_load(const char *dir, struct gen_config *gc, struct wren_err *e) {
    char path[4096];
    snprintf(path, sizeof path, "%s/generation_config.json", dir);
    memset(gc, 0, sizeof *gc);
    gc->sampling = sampler_defaults();
    FILE *f = fopen(path, "rb");
    if (!f) {
        if (errno == ENOENT) return 0;
        return wren_errf(e, "%s: %s", path, strerror(errno));
    }
    fclose(f);
    size_t len;
    char *text = read_file(path, &len, e);
    if (!text) return -1;
    int rc = gen_config_parse(text, len, path, gc, e);
    free(text);
    return rc;
}

static void eos_add(struct eos_set *s, int32_t id) {
    if (id < 0 || eos_set_has(s, id)) return;
    if (s->n < (int)(sizeof s->ids / sizeof s->ids[0])) s->ids[s->n++] = id;
}

void eos_set_build(struct eos_set *s, const struct gen_config *gc, const struct model_config *mc,
                   const struct tokenizer *tok) {
    s->n = 0;
    for (int i = 0; gc && i < gc->n_eos; i++) eos_add(s, gc->eos[i]);
    for (int i = 0; mc && i < mc->n_eos; i++) eos_add(s, mc->eos[i]);
    eos_add(s, tokenizer_token_id(tok, "<|im_end|>"));
    eos_add(s, tokenizer_token_id(tok, "<|endoftext|>"));
}

bool eos_set_has(const struct eos_set *s, int32_t id) {
    for (int i = 0; i < s->n; i++)
        if (s->ids[i] == id) return true;
    return false;
}
