// Test helper (not a test itself): collects chat_parser events, merging consecutive text of one
// kind, so that outputs of differently chunked feeds can be compared.
#pragma once
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "text/chat.h"
#include "util/pyjson.h"
#include "util/strbuf.h"
#include "util/util.h"

struct collected_event {
    enum chat_event_kind kind;
    struct strbuf text; // REASONING/CONTENT text, or "name\0arguments" for a tool call
    int index;
};
struct collected {
    struct collected_event *ev;
    int n;
    int bad_arguments; // tool calls whose arguments are not a JSON object
};

static inline void collect_cb(void *ud, const struct chat_event *e) {
    struct collected *c = ud;
    if (e->kind != CHAT_TOOL_CALL && c->n && c->ev[c->n - 1].kind == e->kind) {
        sb_put(&c->ev[c->n - 1].text, e->text, e->len);
        return;
    }
    c->ev = xrealloc(c->ev, sizeof *c->ev * (size_t)(c->n + 1));
    struct collected_event *x = &c->ev[c->n++];
    *x = (struct collected_event){.kind = e->kind, .index = e->tool_index};
    if (e->kind == CHAT_TOOL_CALL) {
        sb_put(&x->text, e->tool_name, strlen(e->tool_name) + 1);
        sb_puts(&x->text, e->arguments);
        struct wren_err err;
        cJSON *a = pyjson_parse(e->arguments, strlen(e->arguments), 0, &err); // strict, UTF-8
        if (!cJSON_IsObject(a)) c->bad_arguments++;
        cJSON_Delete(a);
    } else {
        sb_put(&x->text, e->text, e->len);
    }
}

static inline void collected_free(struct collected *c) {
    for (int i = 0; i < c->n; i++) sb_free(&c->ev[i].text);
    free(c->ev);
    *c = (struct collected){0};
}

static inline int collected_equal(const struct collected *a, const struct collected *b) {
    if (a->n != b->n) return 0;
    for (int i = 0; i < a->n; i++) {
        const struct collected_event *x = &a->ev[i], *y = &b->ev[i];
        if (x->kind != y->kind || x->index != y->index || x->text.len != y->text.len ||
            (x->text.len && memcmp(x->text.p, y->text.p, x->text.len)))
            return 0;
    }
    return 1;
}

static inline void collected_print(const struct collected *c) {
    static const char *names[] = {"REASONING", "CONTENT", "TOOL_CALL"};
    for (int i = 0; i < c->n; i++) {
        const struct collected_event *x = &c->ev[i];
        fprintf(stderr, "  %s[%zu]: ", names[x->kind], x->text.len);
        for (size_t k = 0; k < x->text.len && k < 300; k++) {
            unsigned char ch = (unsigned char)x->text.p[k];
            if (ch >= 0x20 && ch < 0x7f)
                fputc(ch, stderr);
            else
                fprintf(stderr, "\\x%02x", ch);
        }
        fputc('\n', stderr);
    }
}

// Parses text fed in pieces of the given sizes (cycled; 0 = all at once).
static inline void parse_chunked(const cJSON *tools, bool in_reasoning, const char *text,
                                 size_t len, const size_t *sizes, int n_sizes,
                                 struct collected *out) {
    struct chat_parser *p = chat_parser_new(tools, in_reasoning);
    size_t off = 0;
    for (int k = 0; off < len; k++) {
        size_t n = n_sizes ? sizes[k % n_sizes] : len;
        if (n == 0 || n > len - off) n = len - off;
        chat_parser_feed(p, text + off, n, collect_cb, out);
        off += n;
    }
    chat_parser_finish(p, collect_cb, out);
    chat_parser_free(p);
}
