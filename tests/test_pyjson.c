// pyjson: Python's json spelling of values, and chat_render on trees from plain cJSON_Parse.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "text/chat.h"
#include "util/pyjson.h"
#include "check.h"

static void expect(const char *what, const char *got, const char *want) {
    if (strcmp(got, want)) {
        fprintf(stderr, "FAIL %s: got '%s', want '%s'\n", what, got, want);
        failures++;
    }
}

// json.loads(text) then json.dumps / str() / verbatim, as Python 3 prints them.
static void roundtrip(const char *text, const char *dumps, const char *str) {
    struct wren_err e;
    cJSON *v = pyjson_parse(text, strlen(text), PYJSON_NONFINITE, &e);
    if (!v) {
        fprintf(stderr, "FAIL parse '%s': %s\n", text, e.msg);
        failures++;
        return;
    }
    struct strbuf a = {0}, b = {0};
    pyjson_dump(&a, v);
    pyjson_str(&b, v);
    expect(text, a.p, dumps);
    expect(text, b.p, str);
    sb_free(&a);
    sb_free(&b);
    cJSON_Delete(v);
}

static void rejects(const char *text) {
    struct wren_err e;
    cJSON *v = pyjson_parse(text, strlen(text), 0, &e);
    if (v) {
        fprintf(stderr, "FAIL: accepted invalid JSON '%s'\n", text);
        failures++;
        cJSON_Delete(v);
    }
}

int main(void) {
    roundtrip("1", "1", "1");
    roundtrip("-0", "0", "0");
    roundtrip("1.0", "1.0", "1.0");
    roundtrip("-0.0", "-0.0", "-0.0");
    roundtrip("1E5", "100000.0", "100000.0");
    roundtrip("1e16", "1e+16", "1e+16");
    roundtrip("0.0001", "0.0001", "0.0001");
    roundtrip("0.00001", "1e-05", "1e-05");
    roundtrip("123456789012345678901234567890", "123456789012345678901234567890",
              "123456789012345678901234567890");
    roundtrip("0.30000000000000004", "0.30000000000000004", "0.30000000000000004");
    roundtrip("5e-324", "5e-324", "5e-324");
    roundtrip("1e400", "Infinity", "inf");
    roundtrip("NaN", "NaN", "nan");
    roundtrip("[true, false, null]", "[true, false, null]", "[True, False, None]");
    roundtrip("{\"a\": 1, \"b\": 2, \"a\": 3}", "{\"a\": 3, \"b\": 2}", "{'a': 3, 'b': 2}");
    roundtrip("\"tab\\t\\u0001\\\"é\\ud83d\\ude00\"", "\"tab\\t\\u0001\\\"é😀\"", "tab\t\x01\"é😀");
    roundtrip("[\"it's\", \"a\\\"b\", \"\\u0085\\u00a0\\n\"]",
              "[\"it's\", \"a\\\"b\", \"\xc2\x85\xc2\xa0\\n\"]",
              "[\"it's\", 'a\"b', '\\x85\\xa0\\n']");
    rejects("01");
    rejects("[1,]");
    rejects("{\"a\" 1}");
    rejects("\"\\ud800\"");
    rejects("\"a\x01\"");
    rejects("\"\xc0\xaf\"");
    rejects("NaN"); // only with PYJSON_NONFINITE
    rejects("1 2");

    // A tree from plain cJSON_Parse renders the same, except that integral floats lose ".0".
    const char *req =
        "{\"messages\": [{\"role\": \"user\", \"content\": \"q\"}, {\"role\": "
        "\"assistant\", \"content\": \"\", \"tool_calls\": [{\"function\": {\"name\": "
        "\"f\", \"arguments\": {\"a\": 2, \"b\": 2.5, \"c\": 3.0}}}]}]}";
    struct wren_err e;
    cJSON *exact = chat_request_parse(req, strlen(req), &e), *plain = cJSON_Parse(req);
    char *a = NULL, *b = NULL;
    if (!exact || !plain || chat_render(exact, CHAT_QWEN36, true, &a, &e) ||
        chat_render(plain, CHAT_QWEN36, true, &b, &e)) {
        fprintf(stderr, "FAIL render: %s\n", e.msg);
        failures++;
    } else {
        if (!strstr(a, "<parameter=a>\n2\n") || !strstr(a, "<parameter=b>\n2.5\n") ||
            !strstr(a, "<parameter=c>\n3.0\n") || !strstr(b, "<parameter=c>\n3\n")) {
            fprintf(stderr, "FAIL number spelling in render:\n%s\n---\n%s\n", a, b);
            failures++;
        }
    }
    free(a);
    free(b);
    cJSON_Delete(exact);
    cJSON_Delete(plain);
    return check_finish("pyjson");
}
