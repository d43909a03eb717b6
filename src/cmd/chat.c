// wren chat: an interactive multi-turn conversation in the terminal (or over a pipe). Each turn
// re-renders the whole conversation and prefills only what the session's state lacks.
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "cmd/cmd.h"
#include "cmd/gen_common.h"

static volatile sig_atomic_t interrupted;
static void on_sigint(int sig) {
    (void)sig;
    interrupted = 1;
}

static void usage(FILE *f) {
    fprintf(f, "usage: wren chat -m DIR [options]\n\n"
               "Reads one user message per line from stdin. Commands: /think on|off, /reset,\n"
               "/quit. Ctrl-C stops the reply being generated; Ctrl-D exits.\n\n" GEN_OPTS_HELP
                   OPT_ENGINE_HELP);
}

static int parse(struct gen_opts *o, int argc, char **argv) {
    gen_opts_init(o);
    for (int i = 1; i < argc; i++) {
        int r = gen_opt(o, argc, argv, &i);
        if (r < 0) return -1;
        if (r) continue;
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            usage(stdout);
            exit(0);
        }
        fprintf(stderr, "wren chat: unknown option '%s' (see wren chat --help)\n", argv[i]);
        return -1;
    }
    return 0;
}

static void add_message(cJSON *msgs, const char *role, const char *content, const char *reasoning) {
    cJSON *m = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "role", role);
    cJSON_AddStringToObject(m, "content", content);
    if (reasoning && reasoning[0]) cJSON_AddStringToObject(m, "reasoning_content", reasoning);
    cJSON_AddItemToArray(msgs, m);
}

static cJSON *new_conversation(const struct gen_opts *o) {
    cJSON *msgs = cJSON_CreateArray();
    if (o->system) add_message(msgs, "system", o->system, NULL);
    return msgs;
}

// A line starting with '/': returns 1 to quit, 0 otherwise.
static int command(const char *line, struct gen *g, cJSON **msgs, bool *think) {
    if (!strcmp(line, "/quit") || !strcmp(line, "/exit")) return 1;
    if (!strcmp(line, "/reset")) {
        cJSON_Delete(*msgs);
        *msgs = new_conversation(g->o);
        gen_reset(g);
        fprintf(stderr, "[conversation cleared]\n");
    } else if (!strcmp(line, "/think on") || !strcmp(line, "/think off")) {
        *think = !strcmp(line, "/think on");
        fprintf(stderr, "[thinking %s]\n", *think ? "on" : "off");
    } else if (!strcmp(line, "/think")) {
        fprintf(stderr, "[thinking is %s; /think on|off changes it]\n", *think ? "on" : "off");
    } else {
        fprintf(stderr, "[unknown command %s: use /think on|off, /reset or /quit]\n", line);
    }
    return 0;
}

int cmd_chat(int argc, char **argv) {
    struct gen_opts o;
    if (parse(&o, argc, argv)) return 2;
    struct wren_err e = {{0}};
    struct gen g;
    if (gen_open(&g, &o, &e)) {
        fprintf(stderr, "wren chat: %s\n", e.msg);
        return 1;
    }
    g.snapshots = true;
    g.interrupted = &interrupted;
    // No SA_RESTART: Ctrl-C at the prompt interrupts the read instead of being ignored.
    struct sigaction sa = {0};
    sa.sa_handler = on_sigint;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);

    bool tty = isatty(0), think = !o.no_think;
    cJSON *msgs = new_conversation(&o);
    if (tty)
        fprintf(stderr,
                "wren chat (%s): /think on|off, /reset, /quit; Ctrl-C stops a reply, "
                "Ctrl-D exits\n",
                wren_engine_backend(g.en));
    char *line = NULL;
    size_t cap = 0;
    for (;;) {
        if (tty) {
            fputs("> ", stdout);
            fflush(stdout);
        }
        errno = 0;
        ssize_t n = getline(&line, &cap, stdin);
        if (n < 0) {
            if (errno == EINTR && interrupted) {
                clearerr(stdin);
                interrupted = 0;
                fputs("\n[Ctrl-D or /quit exits]\n", stderr);
                continue;
            }
            if (tty) fputc('\n', stdout);
            break;
        }
        while (n > 0 && (line[n - 1] == '\n' || line[n - 1] == '\r')) line[--n] = 0;
        if (!n) continue;
        if (line[0] == '/') {
            if (command(line, &g, &msgs, &think)) break;
            continue;
        }
        interrupted = 0;
        add_message(msgs, "user", line, NULL);
        struct turn_out t;
        if (gen_chat_turn(&g, msgs, think, &t, &e)) {
            fprintf(stderr, "wren chat: %s\n", e.msg);
            cJSON_DeleteItemFromArray(msgs, cJSON_GetArraySize(msgs) - 1);
            continue;
        }
        turn_summary(&t, true);
        add_message(msgs, "assistant", t.content, t.reasoning);
        turn_out_free(&t);
    }
    free(line);
    cJSON_Delete(msgs);
    gen_close(&g);
    return 0;
}
