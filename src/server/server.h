// `wren serve`: an OpenAI-compatible HTTP server over one engine (see docs/SERVER.md).
#pragma once
#include <stdbool.h>
#include <stddef.h>

#include "engine/engine.h"
#include "util/err.h"

struct server_opts {
    struct wren_engine_opts engine;
    const char *host;       // default 127.0.0.1
    int port;               // default 8080
    const char *api_key;    // NULL: no authentication
    const char *model_name; // reported in responses; default: the model directory's name
    size_t max_body;        // bytes
    int max_messages;
    int max_prompt_tokens;  // 0: the context size
    int max_tokens_default; // when the request sets none (0: until the context is full)
    int queue_size;         // requests waiting behind the one computing
    int max_connections;
    int timeout_s;          // per request, from arrival to the last token
    int idle_timeout_s;     // a connection that sends nothing for this long is closed
    int keepalive_s;        // TCP keepalive idle time (0: off); see http.c, on_connection
    int shutdown_timeout_s; // on SIGINT/SIGTERM, how long the running request may still take
    size_t cache_bytes;     // snapshot cache budget; 0 disables session reuse entirely
    int snapshot_every;     // take a state snapshot every N prompt tokens (< 0: by the backend)
    bool test_replay;       // hidden: accept "wren_replay" (tests of the parsing/streaming path)
};

void server_opts_default(struct server_opts *o);
// Runs until SIGINT/SIGTERM. Returns 0, or -1 with e filled (startup failure).
int server_run(const struct server_opts *o, struct wren_err *e);
