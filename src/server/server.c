// Server lifetime: open the model and tokenizer, start the worker and the HTTP daemon, wait for
// SIGINT/SIGTERM, then stop in order (queue, running job, connections).
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>
#include <microhttpd.h>

#include "engine/gen_config.h"
#include "server/cache.h"
#include "server/http.h"
#include "server/internal.h"
#include "text/chat.h"
#include "text/tokenizer.h"
#include "util/util.h"

void server_opts_default(struct server_opts *o) {
    *o = (struct server_opts){
        .host = "127.0.0.1",
        .port = 8080,
        .max_body = 8u << 20,
        .max_messages = 1024,
        .queue_size = 16,
        .max_connections = 64,
        .timeout_s = 600,
        .idle_timeout_s = 30,
        .cache_bytes = (size_t)4096 << 20,
        .snapshot_every = 2048,
    };
}

static void model_name(struct server *sv, const char *dir) {
    if (sv->o.model_name) {
        snprintf(sv->model_name, sizeof sv->model_name, "%s", sv->o.model_name);
        return;
    }
    size_t n = strlen(dir);
    while (n > 1 && dir[n - 1] == '/') n--;
    size_t start = n;
    while (start > 0 && dir[start - 1] != '/') start--;
    snprintf(sv->model_name, sizeof sv->model_name, "%.*s", (int)(n - start), dir + start);
}

static int open_model(struct server *sv, struct wren_err *e) {
    const char *dir = sv->o.engine.model_dir;
    if (!dir) return wren_errf(e, "no model: pass -m DIR");
    if (!(sv->tok = tokenizer_load(dir, e))) return -1;
    if (!(sv->engine = wren_engine_open(&sv->o.engine, e))) return -1;
    if (!(sv->session = wren_session_new(sv->engine, 0, e))) return -1;
    sv->n_ctx = wren_session_max_ctx(sv->session);
    sv->chat_flavor = (int)chat_flavor_detect(dir);
    sv->im_start = tokenizer_token_id(sv->tok, "<|im_start|>");
    sv->think_end = tokenizer_token_id(sv->tok, "</think>");
    if (tokenizer_token_id(sv->tok, "<|im_end|>") < 0 || sv->im_start < 0)
        return wren_errf(e,
                         "%s: the tokenizer has no <|im_start|>/<|im_end|> tokens (not a Qwen "
                         "chat tokenizer?)",
                         dir);
    struct gen_config gc;
    if (gen_config_load(dir, &gc, e)) return -1;
    sv->gen_defaults = gc.sampling;
    eos_set_build(&sv->eos, &gc, wren_engine_config(sv->engine), sv->tok);
    model_name(sv, dir);
    return 0;
}

static void close_model(struct server *sv) {
    snap_cache_free(sv->cache);
    if (sv->session) wren_session_free(sv->session);
    if (sv->engine) wren_engine_close(sv->engine);
    if (sv->tok) tokenizer_free(sv->tok);
}

int server_run(const struct server_opts *o, struct wren_err *e) {
    struct server *sv = xcalloc(1, sizeof *sv);
    sv->o = *o;
    atomic_init(&sv->stopping, false);
    metrics_init(&sv->metrics);
    queue_init(&sv->queue, o->queue_size);
    if (open_model(sv, e)) {
        close_model(sv);
        free(sv);
        return -1;
    }
    sv->cache = snap_cache_new(o->cache_bytes);

    // Signals are taken synchronously by this thread; every thread started below inherits the
    // mask. A client that disconnects must not kill the server with SIGPIPE.
    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGINT);
    sigaddset(&sigs, SIGTERM);
    signal(SIGPIPE, SIG_IGN);
    pthread_sigmask(SIG_BLOCK, &sigs, NULL);

    pthread_t worker;
    pthread_create(&worker, NULL, worker_main, sv);
    struct MHD_Daemon *d = http_start(sv, e);
    int rc = 0;
    if (d) {
        fprintf(stderr, "wren serve: %s on %s backend, context %d; listening on http://%s:%d\n",
                sv->model_name, wren_engine_backend(sv->engine), sv->n_ctx, o->host, http_port(d));
        int sig;
        sigwait(&sigs, &sig);
        fprintf(stderr, "wren serve: stopping\n");
    } else {
        rc = -1;
    }
    atomic_store(&sv->stopping, true);
    queue_stop(&sv->queue);
    pthread_join(worker, NULL);
    if (d) MHD_stop_daemon(d);
    close_model(sv);
    free(sv);
    return rc;
}
