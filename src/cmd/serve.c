// wren serve: OpenAI-compatible HTTP server (docs/SERVER.md).
#include <stdio.h>
#include <string.h>

#include "cmd/cmd.h"
#include "server/server.h"

static const char USAGE[] =
    "usage: wren serve -m DIR [options]\n"
    "OpenAI-compatible HTTP server: POST /v1/chat/completions, GET /v1/models, /health, "
    "/metrics.\n" OPT_ENGINE_HELP "  --host ADDR              address to bind (default 127.0.0.1)\n"
    "  --port N                 port (default 8080; 0 picks a free one)\n"
    "  --api-key KEY            require 'Authorization: Bearer KEY'\n"
    "  --model-name NAME        model id in responses (default: the directory's name)\n"
    "  --max-body BYTES         largest request body (default 8388608)\n"
    "  --max-messages N         most messages in a request (default 1024)\n"
    "  --max-prompt-tokens N    longest prompt (default: the context size)\n"
    "  --max-tokens N           completion length when a request sets none (default: to the\n"
    "                           end of the context)\n"
    "  --queue N                requests waiting behind the running one (default 16)\n"
    "  --max-connections N      simultaneous connections (default 64)\n"
    "  --timeout SEC            per request, arrival to last token (default 600)\n"
    "  --idle-timeout SEC       close connections silent this long (default 30)\n"
    "  --keepalive SEC          TCP keepalive: drop a connection whose peer stops answering\n"
    "                           for SEC+15 s (default 30; 0 disables)\n"
    "  --shutdown-timeout SEC   on SIGINT/SIGTERM, time the running request gets to finish\n"
    "                           before it is ended with an error (default 10)\n"
    "  --cache-mb N             session snapshot budget in MiB (default 4096; 0 disables reuse)\n"
    "  --snapshot-every N       snapshot the state every N prompt tokens (default 2048, or the\n"
    "                           backend's prefill chunk if larger)\n";

int cmd_serve(int argc, char **argv) {
    struct server_opts o;
    server_opts_default(&o);
    int mb = (int)(o.cache_bytes >> 20), max_body = (int)o.max_body;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = NULL;
        int r = opt_engine(&o.engine, argc, argv, &i);
        if (r < 0) return 2;
        if (r > 0) continue;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            fputs(USAGE, stdout);
            return 0;
        }
#define IS(name)                                                                                   \
    (!strncmp(a, name, strlen(name)) && (a[strlen(name)] == 0 || a[strlen(name)] == '='))
#define VAL()                                                                                      \
    if (!(v = opt_value(argc, argv, &i))) return 2
#define INT(name, lo, hi, dst)                                                                     \
    else if (IS(name)) {                                                                           \
        VAL();                                                                                     \
        if (opt_int(name, v, lo, hi, dst)) return 2;                                               \
    }
        if (IS("--host")) {
            VAL();
            o.host = v;
        } else if (IS("--api-key")) {
            VAL();
            o.api_key = v;
        } else if (IS("--model-name")) {
            VAL();
            o.model_name = v;
        } else if (IS("--test-replay")) {
            o.test_replay = true; // hidden: lets tests replay a given text as the model output
        }
        INT("--port", 0, 65535, &o.port)
        INT("--max-body", 1024, 1 << 30, &max_body)
        INT("--max-messages", 1, 1 << 20, &o.max_messages)
        INT("--max-prompt-tokens", 0, 1 << 24, &o.max_prompt_tokens)
        INT("--max-tokens", 0, 1 << 24, &o.max_tokens_default)
        INT("--queue", 1, 1 << 16, &o.queue_size)
        INT("--max-connections", 1, 1 << 16, &o.max_connections)
        INT("--timeout", 1, 1 << 24, &o.timeout_s)
        INT("--idle-timeout", 1, 1 << 20, &o.idle_timeout_s)
        INT("--keepalive", 0, 3600, &o.keepalive_s)
        INT("--shutdown-timeout", 0, 1 << 20, &o.shutdown_timeout_s)
        INT("--cache-mb", 0, 1 << 24, &mb)
        INT("--snapshot-every", 0, 1 << 24, &o.snapshot_every)
        else {
            fprintf(stderr, "wren serve: unknown option '%s'\n%s", a, USAGE);
            return 2;
        }
#undef INT
#undef VAL
#undef IS
    }
    o.cache_bytes = (size_t)mb << 20;
    o.max_body = (size_t)max_body;
    struct wren_err e = {0};
    if (server_run(&o, &e)) {
        fprintf(stderr, "wren serve: %s\n", e.msg);
        return 1;
    }
    return 0;
}
