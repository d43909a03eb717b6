// wren template: renders an OpenAI-style chat request into the prompt text, byte for byte as the
// checkpoint's official Jinja template does (Qwen3.6's without -m).
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "cmd/cmd.h"
#include "text/chat.h"
#include "util/pyjson.h"
#include "util/util.h"

struct template_opts {
    const char *model_dir, *request, *requests_jsonl, *flavor;
    bool generation_prompt;
};

static void usage(FILE *f) {
    fprintf(f, "usage: wren template [-m DIR] --request F.json [--no-generation-prompt]\n"
               "       wren template [-m DIR] --requests-jsonl F.jsonl [--no-generation-prompt]\n\n"
               "  -m, --model DIR          checkpoint whose chat template flavor to use\n"
               "  --request F.json         one request; the prompt goes to stdout as is\n"
               "  --requests-jsonl F       one request per line; one JSON line out per request:\n"
               "                           {\"prompt\": ...} or {\"error\": ...}\n"
               "  --flavor qwen3.5|qwen3.6 template flavor (overrides -m; default qwen3.6)\n"
               "  --no-generation-prompt   leave out the trailing assistant header\n");
}

// "--name" or "--name=value"
static bool is_opt(const char *arg, const char *name) {
    size_t n = strlen(name);
    return !strncmp(arg, name, n) && (arg[n] == 0 || arg[n] == '=');
}

static int parse_opts(int argc, char **argv, struct template_opts *o) {
    *o = (struct template_opts){.generation_prompt = true};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            exit(0);
        } else if (!strcmp(a, "-m") || is_opt(a, "--model")) {
            if (!(o->model_dir = opt_value(argc, argv, &i))) return -1;
        } else if (is_opt(a, "--requests-jsonl")) {
            if (!(o->requests_jsonl = opt_value(argc, argv, &i))) return -1;
        } else if (is_opt(a, "--request")) {
            if (!(o->request = opt_value(argc, argv, &i))) return -1;
        } else if (is_opt(a, "--flavor")) {
            if (!(o->flavor = opt_value(argc, argv, &i))) return -1;
            if (strcmp(o->flavor, "qwen3.5") && strcmp(o->flavor, "qwen3.6")) {
                fprintf(stderr, "wren template: --flavor: expected qwen3.5 or qwen3.6\n");
                return -1;
            }
        } else if (!strcmp(a, "--no-generation-prompt")) {
            o->generation_prompt = false;
        } else {
            fprintf(stderr, "wren template: unknown option '%s'\n", a);
            return -1;
        }
    }
    if (!o->request == !o->requests_jsonl) {
        fprintf(stderr, "wren template: give exactly one of --request or --requests-jsonl\n");
        return -1;
    }
    return 0;
}

static int render_text(const char *text, size_t len, enum chat_flavor fl, bool gen, char **out,
                       struct wren_err *e) {
    cJSON *req = chat_request_parse(text, len, e);
    if (!req) return -1;
    int rc = chat_render(req, fl, gen, out, e);
    cJSON_Delete(req);
    return rc;
}

static int run_jsonl(const struct template_opts *o, enum chat_flavor fl) {
    struct wren_err e;
    size_t len;
    char *text = read_file(o->requests_jsonl, &len, &e);
    if (!text) {
        fprintf(stderr, "wren template: %s\n", e.msg);
        return 1;
    }
    struct strbuf sb = {0};
    for (char *line = text, *end; line < text + len; line = end + 1) {
        end = memchr(line, '\n', (size_t)(text + len - line));
        if (!end) end = text + len;
        if (end == line) continue;
        char *prompt;
        cJSON *res = cJSON_CreateObject();
        if (render_text(line, (size_t)(end - line), fl, o->generation_prompt, &prompt, &e)) {
            cJSON_AddStringToObject(res, "error", e.msg);
        } else {
            cJSON_AddStringToObject(res, "prompt", prompt);
            free(prompt);
        }
        pyjson_dump(&sb, res);
        sb_putc(&sb, '\n');
        cJSON_Delete(res);
    }
    fwrite(sb.p ? sb.p : "", 1, sb.len, stdout);
    sb_free(&sb);
    free(text);
    return 0;
}

int cmd_template(int argc, char **argv) {
    struct template_opts o;
    if (parse_opts(argc, argv, &o)) {
        usage(stderr);
        return 2;
    }
    enum chat_flavor fl = chat_flavor_detect(o.model_dir);
    if (o.flavor) fl = strcmp(o.flavor, "qwen3.5") ? CHAT_QWEN36 : CHAT_QWEN35;
    if (o.requests_jsonl) return run_jsonl(&o, fl);
    struct wren_err e;
    size_t len;
    char *text = read_file(o.request, &len, &e), *prompt;
    if (!text || render_text(text, len, fl, o.generation_prompt, &prompt, &e)) {
        free(text);
        fprintf(stderr, "wren template: %s\n", e.msg);
        return 1;
    }
    free(text);
    fwrite(prompt, 1, strlen(prompt), stdout);
    free(prompt);
    return fflush(stdout) ? 1 : 0;
}
