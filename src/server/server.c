// Server lifetime: open the model and tokenizer, start the worker and the HTTP daemon, wait for
// SIGINT/SIGTERM, then stop in order (queue, running job, connections).
#include <errno.h>
#include <semaphore.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

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
        .keepalive_s = 30,
        .shutdown_timeout_s = 10,
        .cache_bytes = (size_t)4096 << 20,
        .snapshot_every = -1, // 2048, or the backend's prefill chunk if larger
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
    // periodic snapshots cut the prefill into calls between them: no closer than the backend's
    // chunk unless asked (on a large GPU, 8192-token calls prefill ~25% faster than 2048)
    if (sv->o.snapshot_every < 0) {
        const int chunk = wren_engine_prefill_chunk(sv->engine);
        sv->o.snapshot_every = chunk > 2048 ? chunk : 2048;
    }
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

// Seconds the connections get, once the worker has stopped, to send the last responses (the
// end of a stream, a 503) before the daemon closes them.
#define FLUSH_SEC 2

// Posted once per SIGINT/SIGTERM. A handler rather than a blocked mask and sigwait(): threads
// started while the model loads (the CPU thread pool, the CUDA runtime's) do not block the
// signals, and the default action there would kill the process halfway through a shutdown.
static sem_t signalled;

static void on_signal(int sig) {
    (void)sig;
    sem_post(&signalled); // async-signal-safe
}

static void catch_signals(void) {
    sem_init(&signalled, 0, 0);
    struct sigaction sa = {.sa_handler = on_signal, .sa_flags = SA_RESTART};
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    signal(SIGPIPE, SIG_IGN); // a client that disconnects must not kill the server
}

static void wait_for_signal(void) {
    while (sem_wait(&signalled) && errno == EINTR) continue;
}

// Waits for the worker to return (it does once the running job ends) until `deadline`; false
// when the deadline passes or a second SIGINT/SIGTERM asks to stop at once.
static bool worker_finished_by(struct server *sv, double deadline) {
    struct timespec tick = {0, 20 * 1000000L};
    while (!atomic_load(&sv->worker_done)) {
        if (now_sec() >= deadline || sem_trywait(&signalled) == 0) return false;
        nanosleep(&tick, NULL);
    }
    return true;
}

// The orderly stop: no new requests and the queued ones answered 503 at once; the running one
// gets --shutdown-timeout to finish, then ends with a 503 (or an error event and [DONE] in a
// stream); the responses get FLUSH_SEC to go out; then the connections are closed.
static void shut_down(struct server *sv, pthread_t worker, struct MHD_Daemon *d) {
    atomic_store(&sv->stopping, true);
    queue_stop(&sv->queue);
    double deadline = now_sec() + (d ? sv->o.shutdown_timeout_s : 0);
    if (!worker_finished_by(sv, deadline)) atomic_store(&sv->shutdown_now, true);
    pthread_join(worker, NULL);
    if (!d) return;
    http_drain(sv, FLUSH_SEC);
    MHD_stop_daemon(d);
}

int server_run(const struct server_opts *o, struct wren_err *e) {
    struct server *sv = xcalloc(1, sizeof *sv);
    sv->o = *o;
    atomic_init(&sv->stopping, false);
    atomic_init(&sv->shutdown_now, false);
    atomic_init(&sv->worker_done, false);
    atomic_init(&sv->in_flight, 0);
    metrics_init(&sv->metrics);
    queue_init(&sv->queue, o->queue_size);
    if (open_model(sv, e)) {
        close_model(sv);
        free(sv);
        return -1;
    }
    sv->cache = snap_cache_new(o->cache_bytes);

    catch_signals(); // from here on (while loading, a signal still ends the process at once)
    pthread_t worker;
    pthread_create(&worker, NULL, worker_main, sv);
    struct MHD_Daemon *d = http_start(sv, e);
    int rc = 0;
    if (d) {
        fprintf(stderr, "wren serve: %s on %s backend, context %d; listening on http://%s:%d\n",
                sv->model_name, wren_engine_backend(sv->engine), sv->n_ctx, o->host, http_port(d));
        wait_for_signal();
        fprintf(stderr,
                "wren serve: stopping (a running request gets up to %d s to finish; a second "
                "signal ends it now)\n",
                o->shutdown_timeout_s);
    } else {
        rc = -1;
    }
    shut_down(sv, worker, d);
    close_model(sv);
    free(sv);
    return rc;
}
