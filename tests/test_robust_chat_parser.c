// The output parser under adversarial input: the events must not depend on how the text is
// chunked (every split point, byte by byte, random chunks), partial tags must never reach the
// caller early, and garbage must neither crash it nor grow its memory without bound.
#include "chat_events.h"
#include "check.h"

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static uint32_t rnd(void) { // xorshift64*
    rng_state ^= rng_state >> 12, rng_state ^= rng_state << 25, rng_state ^= rng_state >> 27;
    return (uint32_t)((rng_state * 0x2545F4914F6CDD1Dull) >> 32);
}

static const char *const SAMPLES[] = {
    "Let me think.\n</think>\n\nHello!",
    "\n\nstep\n\n</think>\n\n\nA\n\nB\n",
    "ok</think>\n\nSure.\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n"
    "</parameter>\n<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>\n<tool_call>\n"
    "<function=f>\n<parameter=x>\n{\"a\": [1, 2]}\n</parameter>\n</function>\n</tool_call>",
    "a <tool_ca <<tool_call <</think> x </thin",
    "text\n\n<tool_call>\nbroken\n</tool_call>\n\n<tool_call>\n<function=g>\n</tool_call>tail",
    "</think></think><tool_call><tool_call></tool_call></tool_call>",
    "\n\n\n\n<\n<\n</\n</t\n",
};

// Events of text fed at once vs every other chunking must agree.
static void check_chunkings(const cJSON *tools, const char *text, size_t len, bool in_r,
                            bool all_splits) {
    struct collected whole = {0}, other = {0};
    parse_chunked(tools, in_r, text, len, NULL, 0, &whole);
    if (whole.bad_arguments) {
        fprintf(stderr, "FAIL: tool call arguments are not a JSON object\n");
        failures++;
    }
    size_t one = 1;
    parse_chunked(tools, in_r, text, len, &one, 1, &other);
    int ok = collected_equal(&whole, &other);
    collected_free(&other);
    for (size_t split = 1; ok && all_splits && split < len; split++) { // every split point
        size_t sizes[2] = {split, len};
        parse_chunked(tools, in_r, text, len, sizes, 2, &other);
        ok = collected_equal(&whole, &other);
        collected_free(&other);
    }
    for (int trial = 0; ok && trial < 8; trial++) { // random chunk sizes
        size_t sizes[7];
        for (int k = 0; k < 7; k++) sizes[k] = 1 + rnd() % 13;
        parse_chunked(tools, in_r, text, len, sizes, 7, &other);
        ok = collected_equal(&whole, &other);
        collected_free(&other);
    }
    if (!ok) {
        fprintf(stderr, "FAIL: chunking changes the events for input of %zu bytes; whole:\n", len);
        collected_print(&whole);
        failures++;
    }
    collected_free(&whole);
}

// While streaming, the text delivered so far never ends in a tag's beginning.
static void check_no_early_partial_tags(void) {
    static const char *const cases[][2] = {
        {"Hello <tool_", "Hello "},
        {"Hi\n\n<tool_call", "Hi"},
        {"a<", "a"},
        {"a <tool_call>\n<fun", "a "},
        {"x\n", "x"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        struct collected c = {0};
        struct chat_parser *p = chat_parser_new(NULL, false);
        chat_parser_feed(p, cases[i][0], strlen(cases[i][0]), collect_cb, &c);
        const char *want = cases[i][1];
        size_t got_len = c.n ? c.ev[0].text.len : 0;
        if (c.n > 1 || got_len != strlen(want) ||
            (got_len && memcmp(c.ev[0].text.p, want, got_len))) {
            fprintf(stderr, "FAIL: feeding '%s' delivered too much or too little:\n", cases[i][0]);
            collected_print(&c);
            failures++;
        }
        chat_parser_finish(p, collect_cb, &c); // the held text arrives at the end
        size_t total = 0;
        for (int k = 0; k < c.n; k++) total += c.ev[k].text.len;
        if (total != strlen(cases[i][0])) {
            fprintf(stderr, "FAIL: '%s' lost text at finish\n", cases[i][0]);
            failures++;
        }
        chat_parser_free(p);
        collected_free(&c);
    }
}

static const char *const PIECES[] = {
    "<",           ">",
    "\n",          "</think>",
    "<tool_call>", "</tool_call>",
    "<function=",  "</function>",
    "<parameter=", "</parameter>",
    "get_weather", "city",
    "1",           "{\"a\": 1}",
    "true",        "null",
    "[",           "\"",
    "天",          "\xff",
    "\x00",        " ",
    "<tool",       "</thi",
};

static size_t garbage(char *buf, size_t cap) {
    size_t n = 0, want = rnd() % cap;
    while (n < want) {
        if (rnd() % 4 == 0) {
            buf[n++] = (char)(rnd() & 0xff);
            continue;
        }
        const char *piece = PIECES[rnd() % (sizeof PIECES / sizeof PIECES[0])];
        size_t k = piece[0] ? strlen(piece) : 1;
        if (n + k > want) break;
        memcpy(buf + n, piece, k);
        n += k;
    }
    return n;
}

// Huge inputs: a long run of newlines and an endless tool call must stream out as content.
static void check_bounded(void) {
    size_t n = 3u << 20;
    char *big = xmalloc(n);
    memset(big, '\n', n);
    memcpy(big, "x<tool_call>\n<function=f>\n", 26);
    struct collected c = {0};
    size_t chunk = 4096;
    parse_chunked(NULL, false, big, n, &chunk, 1, &c);
    size_t total = 0;
    for (int k = 0; k < c.n; k++) total += c.ev[k].text.len;
    if (c.n < 1 || c.ev[0].kind != CHAT_CONTENT || total != n) {
        fprintf(stderr, "FAIL: oversized tool call not given up as content (%zu of %zu bytes)\n",
                total, n);
        failures++;
    }
    collected_free(&c);
    free(big);
}

int main(void) {
    cJSON *tools = cJSON_Parse(
        "[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"parameters\":{"
        "\"properties\":{\"city\":{\"type\":\"string\"},\"days\":{\"type\":\"integer\"}}}}},"
        "{\"function\":null},5,\"x\",{\"name\":\"f\",\"parameters\":{\"properties\":{\"x\":"
        "{\"anyOf\":[{\"anyOf\":[]},{\"type\":[1,\"object\"]}]},\"1\":{\"enum\":[]}}}}]");
    for (size_t i = 0; i < sizeof SAMPLES / sizeof SAMPLES[0]; i++)
        for (int r = 0; r < 2; r++) check_chunkings(tools, SAMPLES[i], strlen(SAMPLES[i]), r, true);
    check_no_early_partial_tags();
    static char buf[4096];
    for (int iter = 0; iter < 3000 && failures < 5; iter++) {
        size_t n = garbage(buf, iter % 10 ? 300 : sizeof buf);
        check_chunkings(iter % 3 ? tools : NULL, buf, n, iter & 1, iter % 5 == 0 && n <= 600);
    }
    check_bounded();
    cJSON_Delete(tools);
    return check_finish("robust_chat_parser");
}
