// The output parser on known replies: reasoning split, content, tool calls with typed args.
#include "chat_events.h"
#include "check.h"

static cJSON *tools;

// expect: events as "R:text", "C:text", "T:name:args" separated by '|' (text without '|').
static void check(const char *what, bool in_reasoning, const char *text, const char *expect) {
    struct collected c = {0};
    parse_chunked(tools, in_reasoning, text, strlen(text), NULL, 0, &c);
    struct strbuf got = {0};
    for (int i = 0; i < c.n; i++) {
        if (i) sb_putc(&got, '|');
        const struct collected_event *x = &c.ev[i];
        if (x->kind == CHAT_TOOL_CALL)
            sb_printf(&got, "T:%s:%s", x->text.p, x->text.p + strlen(x->text.p) + 1);
        else
            sb_printf(&got, "%c:%.*s", x->kind == CHAT_REASONING ? 'R' : 'C', (int)x->text.len,
                      x->text.p);
    }
    if (strcmp(got.p ? got.p : "", expect)) {
        fprintf(stderr, "FAIL %s\n  want: %s\n  got:  %s\n", what, expect, got.p ? got.p : "");
        failures++;
    }
    sb_free(&got);
    collected_free(&c);
}

static const char TOOLS[] =
    "[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"parameters\":{\"type\":"
    "\"object\",\"properties\":{\"city\":{\"type\":\"string\"},\"days\":{\"type\":\"integer\"},"
    "\"ratio\":{\"type\":\"number\"},\"metric\":{\"type\":\"boolean\"},\"opts\":{\"type\":"
    "\"object\"},\"tags\":{\"type\":\"array\"},\"none\":{\"type\":\"null\"},\"maybe\":{"
    "\"type\":[\"string\",\"null\"]},\"any\":{\"anyOf\":[{\"type\":\"integer\"},{\"type\":"
    "\"string\"}]},\"unit\":{\"enum\":[\"c\",\"f\"]}}}}},"
    "{\"name\":\"bare\",\"parameters\":{\"properties\":{\"n\":{\"type\":\"integer\"}}}}]";

#define CALL(body)  "<tool_call>\n<function=get_weather>\n" body "</function>\n</tool_call>"
#define PARAM(n, v) "<parameter=" n ">\n" v "\n</parameter>\n"

int main(void) {
    tools = cJSON_Parse(TOOLS);
    check("reasoning then content", true, "Let me think.\n</think>\n\nHello!",
          "R:Let me think.|C:Hello!");
    check("newlines the template writes are stripped", true,
          "\n\nstep 1\n\nstep 2\n\n</think>\n\n\nA\n\nB\n", "R:step 1\n\nstep 2|C:A\n\nB\n");
    check("no reasoning", false, "Just content </think> here", "C:Just content </think> here");
    check("tool_call inside reasoning is reasoning", true, "<tool_call>x</tool_call></think>ok",
          "R:<tool_call>x</tool_call>|C:ok");
    check("partial tags at the end stay text", false, "a <tool_ca", "C:a <tool_ca");
    check("unterminated reasoning", true, "thinking </thi", "R:thinking </thi");
    check("not a tag", false, "x << <tool <tool_calls> y", "C:x << <tool <tool_calls> y");
    check("tool call after content", true,
          "ok</think>\n\nSure.\n\n" CALL(PARAM("city", "Paris") PARAM("days", "3")),
          "R:ok|C:Sure.|T:get_weather:{\"city\": \"Paris\", \"days\": 3}");
    check("typed by the schema", false,
          CALL(PARAM("city", "123") PARAM("days", "007") PARAM("ratio", "1.50")
                   PARAM("metric", "True") PARAM("opts", "{\"a\": [1, {\"b\": null}]}")
                       PARAM("tags", "[\"x\", 2]") PARAM("none", "null") PARAM("maybe", "null")
                           PARAM("any", "5") PARAM("unit", "c")),
          "T:get_weather:{\"city\": \"123\", \"days\": \"007\", \"ratio\": 1.50, \"metric\": "
          "true, \"opts\": {\"a\": [1, {\"b\": null}]}, \"tags\": [\"x\", 2], \"none\": null, "
          "\"maybe\": \"null\", \"any\": \"5\", \"unit\": \"c\"}");
    check("unknown parameters: JSON if valid, else string", false,
          CALL(PARAM("x", "42") PARAM("y", "hello") PARAM("z", "false") PARAM("w", "[1,")),
          "T:get_weather:{\"x\": 42, \"y\": \"hello\", \"z\": false, \"w\": \"[1,\"}");
    check("multi-line values and quotes", false, CALL(PARAM("city", "line 1\n\"line\" 2\\n\n")),
          "T:get_weather:{\"city\": \"line 1\\n\\\"line\\\" 2\\\\n\\n\"}");
    check(
        "bare function tools, unknown tools", false,
        "<tool_call>\n<function=bare>\n" PARAM("n", "7") "</function>\n</tool_call>\n"
                                                         "<tool_call>\n<function=other>\n" PARAM(
                                                             "n", "7") "</function>\n</tool_call>",
        "T:bare:{\"n\": 7}|T:other:{\"n\": 7}");
    check("missing </parameter> and </function>", false,
          "<tool_call>\n<function=bare>\n<parameter=n>\n1\n<parameter=m>\nx\n</tool_call>",
          "T:bare:{\"n\": 1, \"m\": \"x\"}");
    check("repeated parameter keeps the last value", false,
          CALL(PARAM("city", "A") PARAM("days", "1") PARAM("city", "B")),
          "T:get_weather:{\"city\": \"B\", \"days\": 1}");
    check("malformed tool call is content, newlines kept", false,
          "text\n\n<tool_call>\nno function here\n</tool_call>\nafter",
          "C:text\n\n<tool_call>\nno function here\n</tool_call>\nafter");
    check("unterminated tool call is content", false, "see:\n<tool_call>\n<function=f>\n<param",
          "C:see:\n<tool_call>\n<function=f>\n<param");
    check("text after a tool call", false, CALL(PARAM("city", "X")) "\n\nDone.",
          "T:get_weather:{\"city\": \"X\"}|C:Done.");
    check("empty reply", true, "", "");
    check("only the think end", true, "\n</think>\n\n", "");
    check("UTF-8 passes through", false,
          "天气 🌤 <tool_call>\n<function=get_weather>\n" PARAM(
              "city", "巴黎") "</function>\n</tool_call>",
          "C:天气 🌤 |T:get_weather:{\"city\": \"巴黎\"}");
    if (!chat_prompt_in_reasoning("<|im_start|>assistant\n<think>\n") ||
        chat_prompt_in_reasoning("<|im_start|>assistant\n<think>\n\n</think>\n\n") ||
        chat_prompt_in_reasoning("")) {
        fprintf(stderr, "FAIL chat_prompt_in_reasoning\n");
        failures++;
    }
    cJSON_Delete(tools);
    return check_finish("chat_parser");
}
