// The streaming output parser: splits generated text into reasoning, content and tool calls.
//
// Byte by byte, so the events do not depend on how the text is chunked. What is stripped (the
// newlines the template itself writes around tags, so that re-rendering a reply reproduces it):
//   - '\n's at the start of the reasoning, of the content, and after each </tool_call>;
//   - '\n's right before </think> and before <tool_call> (the template writes "\n</think>\n\n"
//     and "\n\n<tool_call>", and '\n' between calls).
// Held-back text: a '<' and what follows while it may still become the mode's tag (</think> in
// reasoning, <tool_call> in content), and a run of '\n's until the next byte shows whether a tag
// follows; both are counted or tiny, so memory stays bounded. A tool call block is collected
// whole (at most TOOL_MAX bytes, beyond which it is given up as content) and emitted when
// </tool_call> arrives; a malformed or unterminated one is emitted as content, with its '\n's.
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "text/chat.h"
#include "text/chat_toolcall.h"
#include "util/strbuf.h"
#include "util/util.h"

enum { TOOL_MAX = 1 << 20, OUT_FLUSH = 1 << 16 };
enum mode { M_REASONING, M_CONTENT, M_TOOL };

static const char THINK_END[] = "</think>", CALL_OPEN[] = "<tool_call>",
                  CALL_CLOSE[] = "</tool_call>";

struct chat_parser {
    cJSON *tools;
    enum mode mode;
    bool at_start;  // nothing emitted yet in this section: its leading '\n's are dropped
    size_t nl_held; // '\n's not yet emitted (dropped if a tag follows)
    char hold[16];  // a '<' and what follows while it may still be the mode's tag
    size_t hold_len;
    struct strbuf call; // tool call body so far
    size_t call_nl;     // the '\n's held before <tool_call>, restored if the call is malformed
    int n_calls;
    struct strbuf out; // pending text of out_kind, delivered at the end of each feed
    enum chat_event_kind out_kind;
    chat_event_cb cb;
    void *ud;
};

struct chat_parser *chat_parser_new(const cJSON *tools, bool in_reasoning) {
    struct chat_parser *p = xcalloc(1, sizeof *p);
    p->tools = cJSON_IsArray(tools) ? cJSON_Duplicate(tools, 1) : NULL;
    p->mode = in_reasoning ? M_REASONING : M_CONTENT;
    p->at_start = true;
    return p;
}

void chat_parser_free(struct chat_parser *p) {
    if (!p) return;
    cJSON_Delete(p->tools);
    sb_free(&p->call);
    sb_free(&p->out);
    free(p);
}

static void flush(struct chat_parser *p) {
    if (!p->out.len) return;
    struct chat_event ev = {.kind = p->out_kind, .text = p->out.p, .len = p->out.len};
    p->cb(p->ud, &ev);
    p->out.len = 0;
}

static void emit(struct chat_parser *p, enum chat_event_kind kind, const char *s, size_t n) {
    if (p->out.len && p->out_kind != kind) flush(p);
    p->out_kind = kind;
    sb_put(&p->out, s, n);
    if (p->out.len >= OUT_FLUSH) flush(p);
}

static void emit_newlines(struct chat_parser *p, enum chat_event_kind kind, size_t n) {
    static const char nl[64] = "\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n"
                               "\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n";
    while (n) {
        size_t k = n < sizeof nl ? n : sizeof nl;
        emit(p, kind, nl, k);
        n -= k;
    }
}

static enum chat_event_kind text_kind(const struct chat_parser *p) {
    return p->mode == M_REASONING ? CHAT_REASONING : CHAT_CONTENT;
}

static void put_text(struct chat_parser *p, const char *s, size_t n) {
    emit_newlines(p, text_kind(p), p->nl_held);
    p->nl_held = 0;
    emit(p, text_kind(p), s, n);
    p->at_start = false;
}

// The tool call block as plain content (malformed, too long, or unterminated).
static void call_as_content(struct chat_parser *p, bool closed) {
    p->mode = M_CONTENT;
    emit_newlines(p, CHAT_CONTENT, p->call_nl);
    emit(p, CHAT_CONTENT, CALL_OPEN, strlen(CALL_OPEN));
    emit(p, CHAT_CONTENT, p->call.p ? p->call.p : "", p->call.len);
    if (closed) emit(p, CHAT_CONTENT, CALL_CLOSE, strlen(CALL_CLOSE));
    p->call.len = p->call_nl = 0;
    p->at_start = false;
}

static void end_call(struct chat_parser *p) {
    size_t body = p->call.len - strlen(CALL_CLOSE);
    char *name, *args;
    if (chat_toolcall_parse(p->call.p, body, p->tools, &name, &args)) {
        p->call.len = body;
        call_as_content(p, true);
        return;
    }
    flush(p);
    struct chat_event ev = {
        .kind = CHAT_TOOL_CALL, .tool_index = p->n_calls++, .tool_name = name, .arguments = args};
    p->cb(p->ud, &ev);
    free(name);
    free(args);
    p->mode = M_CONTENT;
    p->call.len = p->call_nl = 0;
    p->at_start = true; // '\n's between and after calls are the template's
}

static void step(struct chat_parser *p, char c);

static void step_text(struct chat_parser *p, char c) {
    const char *tag = p->mode == M_REASONING ? THINK_END : CALL_OPEN;
    size_t tag_len = strlen(tag);
    if (p->hold_len || c == '<') {
        p->hold[p->hold_len++] = c;
        if (memcmp(p->hold, tag, p->hold_len)) { // not the tag: '<' is text, rescan the rest
            char rest[sizeof p->hold];
            size_t n = p->hold_len - 1;
            memcpy(rest, p->hold + 1, n);
            p->hold_len = 0;
            put_text(p, "<", 1);
            for (size_t i = 0; i < n; i++) step(p, rest[i]);
        } else if (p->hold_len == tag_len) {
            p->hold_len = 0;
            if (p->mode == M_REASONING) {
                p->mode = M_CONTENT;
                p->nl_held = 0;
                p->at_start = true;
            } else {
                p->mode = M_TOOL;
                p->call_nl = p->nl_held;
                p->nl_held = 0;
                p->call.len = 0;
            }
        }
        return;
    }
    if (c == '\n') {
        if (!p->at_start) p->nl_held++;
        return;
    }
    put_text(p, &c, 1);
}

static void step(struct chat_parser *p, char c) {
    if (p->mode != M_TOOL) {
        step_text(p, c);
        return;
    }
    sb_putc(&p->call, c);
    size_t k = strlen(CALL_CLOSE);
    if (p->call.len >= k && !memcmp(p->call.p + p->call.len - k, CALL_CLOSE, k))
        end_call(p);
    else if (p->call.len > TOOL_MAX)
        call_as_content(p, false);
}

void chat_parser_feed(struct chat_parser *p, const char *text, size_t len, chat_event_cb cb,
                      void *ud) {
    p->cb = cb, p->ud = ud;
    for (size_t i = 0; i < len; i++) step(p, text[i]);
    flush(p);
}

void chat_parser_finish(struct chat_parser *p, chat_event_cb cb, void *ud) {
    p->cb = cb, p->ud = ud;
    if (p->mode == M_TOOL) {
        call_as_content(p, false);
    } else {
        size_t n = p->hold_len;
        p->hold_len = 0;
        emit_newlines(p, text_kind(p), p->nl_held);
        p->nl_held = 0;
        emit(p, text_kind(p), p->hold, n);
    }
    flush(p);
    p->mode = M_CONTENT;
    p->at_start = false;
}

bool chat_prompt_in_reasoning(const char *prompt) {
    size_t n = strlen(prompt), k = strlen("<think>\n");
    return n >= k && !memcmp(prompt + n - k, "<think>\n", k);
}
