// The text pipeline around the BPE model, as tokenizer.json describes it: normalizer,
// pre-tokenizer, decoder. Only what Qwen's byte-level BPE uses is implemented; anything else is
// refused by name rather than silently ignored.
#include <stdio.h>
#include <string.h>

#include "text/tok_internal.h"
#include "text/tok_json.h"

static int load_normalizer(struct tokenizer *t, const struct jv *n, struct wren_err *e) {
    if (!n || jv_is(n, JV_NULL)) return 0;
    const char *ty = jv_type(n);
    if (ty && !strcmp(ty, "NFC")) {
        t->nfc = true;
        return 0;
    }
    if (ty && !strcmp(ty, "Sequence")) {
        const struct jv *list = jv_get(n, "normalizers");
        if (!jv_is(list, JV_ARRAY))
            return wren_errf(e, "normalizer Sequence needs a \"normalizers\" list");
        for (const struct jv *it = list->child; it; it = it->next)
            if (load_normalizer(t, it, e)) return -1;
        return 0;
    }
    return wren_errf(e, "unsupported normalizer %s (only NFC is implemented)",
                     ty ? ty : "(no type)");
}

static int load_split(struct tokenizer *t, const struct jv *s, struct wren_err *e) {
    if (t->split_re) return wren_errf(e, "unsupported pre-tokenizer: more than one Split");
    if (!jv_str_is(s, "behavior", "Isolated"))
        return wren_errf(e, "unsupported Split behavior (only \"Isolated\" is implemented)");
    bool invert = false;
    if (jv_get_bool(s, "invert", false, &invert, e)) return -1;
    if (invert) return wren_errf(e, "unsupported Split with invert=true");
    const struct jv *pat = jv_get(s, "pattern");
    const struct jv *re = jv_get(pat, "Regex");
    const struct jv *lit = jv_get(pat, "String");
    const struct jv *p = jv_is(re, JV_STRING) ? re : lit;
    if (!jv_is(p, JV_STRING) || !p->str[0])
        return wren_errf(e, "Split needs a pattern {\"Regex\": \"...\"} or {\"String\": \"...\"}");
    t->split_re = tok_regex_compile(p->str, p->len, p == lit, e);
    return t->split_re ? 0 : -1;
}

static int check_bytelevel(const struct jv *b, const char *what, bool pre, struct wren_err *e) {
    bool prefix = false, use_regex = false;
    if (jv_get_bool(b, "add_prefix_space", true, &prefix, e)) return -1;
    if (jv_get_bool(b, "use_regex", true, &use_regex, e)) return -1;
    if (prefix && pre)
        return wren_errf(e, "unsupported %s ByteLevel with add_prefix_space=true", what);
    if (use_regex && pre)
        return wren_errf(e, "unsupported %s ByteLevel with use_regex=true (the GPT-2 regex)", what);
    return 0;
}

static int load_pre_tokenizer(struct tokenizer *t, const struct jv *p, struct wren_err *e) {
    if (!p || jv_is(p, JV_NULL))
        return wren_errf(e, "missing pre_tokenizer (a byte-level BPE tokenizer needs ByteLevel)");
    const struct jv *one[1] = {p};
    const struct jv *list = NULL;
    const char *ty = jv_type(p);
    if (ty && !strcmp(ty, "Sequence")) {
        list = jv_get(p, "pretokenizers");
        if (!jv_is(list, JV_ARRAY))
            return wren_errf(e, "pre_tokenizer Sequence needs a \"pretokenizers\" list");
    }
    bool byte_level = false;
    for (const struct jv *it = list ? list->child : one[0]; it; it = list ? it->next : NULL) {
        const char *k = jv_type(it);
        if (k && !strcmp(k, "Split")) {
            if (byte_level)
                return wren_errf(e, "unsupported pre-tokenizer order: Split after ByteLevel");
            if (load_split(t, it, e)) return -1;
        } else if (k && !strcmp(k, "ByteLevel")) {
            if (check_bytelevel(it, "pre-tokenizer", true, e)) return -1;
            byte_level = true;
        } else {
            return wren_errf(e,
                             "unsupported pre-tokenizer %s (Split and ByteLevel are implemented)",
                             k ? k : "(no type)");
        }
    }
    if (!byte_level) return wren_errf(e, "unsupported pre-tokenizer: no ByteLevel step");
    return 0;
}

static int load_decoder(const struct jv *d, struct wren_err *e) {
    if (!d || jv_is(d, JV_NULL)) return 0;
    const char *ty = jv_type(d);
    if (ty && !strcmp(ty, "ByteLevel")) return 0;
    return wren_errf(e, "unsupported decoder %s (only ByteLevel is implemented)",
                     ty ? ty : "(no type)");
}

int tok_load_pipeline(struct tokenizer *t, const struct jv *root, struct wren_err *e) {
    if (load_normalizer(t, jv_get(root, "normalizer"), e)) return -1;
    if (load_pre_tokenizer(t, jv_get(root, "pre_tokenizer"), e)) return -1;
    return load_decoder(jv_get(root, "decoder"), e);
}
