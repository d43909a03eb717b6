// JSON the way Python's json module reads and writes it, on cJSON trees. The chat templates
// are rendered by jinja2, whose `tojson` is json.dumps(ensure_ascii=False) and whose `string`
// is Python's str(): to match them byte for byte a number must remember whether it was written
// as an integer ("1") or a float ("1.0", "1e3"), which cJSON forgets. pyjson_parse therefore
// keeps each number's source text in the node's valuestring (cJSON frees it with the node;
// valuedouble is set as usual, so other cJSON code is unaffected).
#pragma once
#include <stdbool.h>
#include <stddef.h>

#include "util/err.h"
#include "util/strbuf.h"

struct cJSON;

enum {
    PYJSON_NONFINITE = 1, // accept NaN, Infinity, -Infinity like json.loads (not standard JSON)
};

// Parses one JSON value (surrounding whitespace allowed) like json.loads: strict syntax, valid
// UTF-8 only, no raw control characters in strings, duplicate keys keep the first key's place
// and the last value. Refused (Python-accepted) corners: "\u0000" and lone surrogates in
// strings, nesting deeper than 512. Returns NULL with a message in e on error.
struct cJSON *pyjson_parse(const char *text, size_t len, int flags, struct wren_err *e);

// Makes a cJSON object's keys unique the way a Python dict built from its pairs would be: each
// repeated key keeps its first position and takes its last value.
void pyjson_dedupe_keys(struct cJSON *obj);

// json.dumps(v, ensure_ascii=False): ", " and ": " separators, keys in order, Python's int and
// float spelling (1, 1.0, 1e+16, NaN, Infinity).
void pyjson_dump(struct strbuf *sb, const struct cJSON *v);
// Like pyjson_dump but numbers are written as their source text (always valid JSON).
void pyjson_dump_verbatim(struct strbuf *sb, const struct cJSON *v);
// Python's str(v): strings as they are, True/False/None, ints and float repr, and repr() of
// lists and dicts ({'a': [1, 'x']}).
void pyjson_str(struct strbuf *sb, const struct cJSON *v);
// Python's repr of a float (shortest round-trip digits; 1e-05, 0.0001, 1e+16, 1.0).
void py_float_repr(struct strbuf *sb, double d);
// A NUL-terminated copy of s[0..n) that is valid UTF-8: each invalid byte becomes U+FFFD (like
// Python's decode(errors="replace") per byte) and the copy ends at the first NUL byte.
char *utf8_valid_copy(const char *s, size_t n);
// Python truthiness of a JSON value; NULL (undefined) is false.
bool py_truthy(const struct cJSON *v);
// The value of key in object o (the last one if the key repeats), NULL if o is not an object.
struct cJSON *pyjson_get(const struct cJSON *o, const char *key);
