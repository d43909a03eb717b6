// A small JSON reader for tokenizer.json. cJSON takes ~130 ms on the 11 MB Qwen file (one malloc
// per value); this one decodes strings in place in the file buffer and allocates values from an
// arena, which brings the whole tokenizer load under the 150 ms budget. Strict: rejects what
// serde_json (the tokenizers library's reader) rejects in the cases that matter here.
#pragma once
#include <stdbool.h>
#include <stddef.h>

#include "util/err.h"

enum jv_type { JV_NULL, JV_FALSE, JV_TRUE, JV_NUMBER, JV_STRING, JV_ARRAY, JV_OBJECT };

struct jv {
    enum jv_type type;
    int n;           // number of children (arrays, objects)
    const char *key; // member name inside an object (NUL-terminated), else NULL
    size_t key_len;
    char *str; // JV_STRING: decoded text, NUL-terminated (may contain NULs: use len)
    size_t len;
    double num;
    struct jv *child, *next;
};

struct jv_doc; // owns the values

// Parses text[0..len) (modified in place; must stay alive as long as the document). Returns the
// root value, or NULL with a message naming the byte offset.
struct jv *jv_parse(char *text, size_t len, struct jv_doc **doc, struct wren_err *e);
void jv_free(struct jv_doc *doc);

// Member of an object by name; NULL if absent or o is not an object.
const struct jv *jv_get(const struct jv *o, const char *key);
static inline bool jv_is(const struct jv *v, enum jv_type t) {
    return v && v->type == t;
}
// Boolean member: dflt when absent or null, an error when of another type.
int jv_get_bool(const struct jv *o, const char *key, bool dflt, bool *out, struct wren_err *e);
// The "type" member's string, or NULL.
const char *jv_type(const struct jv *o);
// Whether member `key` is the string `want`.
bool jv_str_is(const struct jv *o, const char *key, const char *want);
