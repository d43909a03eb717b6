// wren run: one prompt (or a whole conversation), one streamed reply.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "cmd/cmd.h"
#include "cmd/gen_common.h"
#include "util/util.h"

struct run_opts {
    struct gen_opts gen;
    const char *prompt;        // NULL: read stdin
    const char *messages_path; // a conversation instead of one prompt
    bool raw;                  // the prompt is the model's input as is, no chat template
};

static void usage(FILE *f) {
    fprintf(f, "usage: wren run -m DIR [-p PROMPT | --messages FILE | stdin] [options]\n\n"
               "Generates a reply and streams it to stdout. Reasoning is dimmed on a terminal and\n"
               "goes to stderr otherwise; a summary line ends on stderr.\n\n"
               "  -p, --prompt TEXT        the user message (default: read stdin)\n"
               "  --messages FILE          a conversation: JSON array of OpenAI-style messages\n"
               "  --raw                    feed the prompt as is, without the chat "
               "template\n" GEN_OPTS_HELP OPT_ENGINE_HELP);
}

static int parse(struct run_opts *o, int argc, char **argv) {
    memset(o, 0, sizeof *o);
    gen_opts_init(&o->gen);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        int r = gen_opt(&o->gen, argc, argv, &i);
        if (r < 0) return -1;
        if (r) continue;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            exit(0);
        } else if (!strcmp(a, "-p") || !strcmp(a, "--prompt") || !strncmp(a, "--prompt=", 9)) {
            if (!(o->prompt = opt_value(argc, argv, &i))) return -1;
        } else if (!strcmp(a, "--messages") || !strncmp(a, "--messages=", 11)) {
            if (!(o->messages_path = opt_value(argc, argv, &i))) return -1;
        } else if (!strcmp(a, "--raw")) {
            o->raw = true;
        } else {
            fprintf(stderr, "wren run: unknown option '%s' (see wren run --help)\n", a);
            return -1;
        }
    }
    if (o->messages_path && (o->prompt || o->gen.system || o->raw)) {
        fprintf(stderr, "wren run: --messages holds the whole conversation; it does not combine "
                        "with -p, --system or --raw\n");
        return -1;
    }
    if (o->raw && (o->gen.system || o->gen.no_think)) {
        fprintf(stderr, "wren run: --raw feeds the prompt as is; --system and --no-think need "
                        "the chat template\n");
        return -1;
    }
    return 0;
}

static char *read_stdin(struct wren_err *e) {
    if (isatty(0)) fprintf(stderr, "(reading the prompt from stdin; end it with Ctrl-D)\n");
    size_t n = 0, cap = 4096;
    char *s = xmalloc(cap);
    size_t got;
    while ((got = fread(s + n, 1, cap - n - 1, stdin)) > 0) {
        n += got;
        if (n + 1 == cap) s = xrealloc(s, cap *= 2);
    }
    if (ferror(stdin)) {
        free(s);
        wren_errf(e, "reading the prompt from stdin failed");
        return NULL;
    }
    s[n] = 0;
    return s;
}

// [system?, user] from the options, or the array in --messages (a bare array or {"messages": []}).
static cJSON *conversation(const struct run_opts *o, const char *prompt, struct wren_err *e) {
    if (o->messages_path) {
        size_t len;
        char *text = read_file(o->messages_path, &len, e);
        if (!text) return NULL;
        cJSON *root = cJSON_ParseWithLength(text, len);
        free(text);
        cJSON *msgs = cJSON_IsObject(root) ? cJSON_DetachItemFromObject(root, "messages") : root;
        if (msgs != root) cJSON_Delete(root);
        if (!cJSON_IsArray(msgs)) {
            cJSON_Delete(msgs);
            wren_errf(e, "%s: expected a JSON array of messages (or an object with \"messages\")",
                      o->messages_path);
            return NULL;
        }
        return msgs;
    }
    cJSON *msgs = cJSON_CreateArray();
    if (o->gen.system) {
        cJSON *m = cJSON_CreateObject();
        cJSON_AddStringToObject(m, "role", "system");
        cJSON_AddStringToObject(m, "content", o->gen.system);
        cJSON_AddItemToArray(msgs, m);
    }
    cJSON *m = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "role", "user");
    cJSON_AddStringToObject(m, "content", prompt);
    cJSON_AddItemToArray(msgs, m);
    return msgs;
}

int cmd_run(int argc, char **argv) {
    struct run_opts o;
    if (parse(&o, argc, argv)) return 2;
    struct wren_err e = {{0}};
    char *input = NULL;
    cJSON *msgs = NULL;
    struct gen g = {0};
    struct turn_out t = {0};
    int status = 1;
    const char *prompt = o.prompt;
    if (!prompt && !o.messages_path) {
        if (!(input = read_stdin(&e))) goto out;
        prompt = input;
    }
    if (!o.raw && !(msgs = conversation(&o, prompt, &e))) goto out;
    if (gen_open(&g, &o.gen, &e)) goto out;
    if (o.raw ? gen_raw_turn(&g, prompt, &t, &e) : gen_chat_turn(&g, msgs, !o.gen.no_think, &t, &e))
        goto out;
    turn_summary(&t, false);
    status = 0;
out:
    if (status) fprintf(stderr, "wren run: %s\n", e.msg);
    turn_out_free(&t);
    gen_close(&g);
    cJSON_Delete(msgs);
    free(input);
    return status;
}
