// The single worker: owns the engine session and the snapshot cache, takes one job at a time,
// resumes from the longest saved prefix, prefills the rest and streams the reply through the
// stop-sequence filter and the chat output parser.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cjson/cJSON.h>

#include "server/cache.h"
#include "server/internal.h"
#include "text/chat.h"
#include "text/stop_strings.h"
#include "text/tokenizer.h"
#include "util/util.h"

struct gen {
    struct server *sv;
    struct job *j;
    struct detok dt;
    char *text; // one token's text (detok_out_cap bytes)
    size_t text_cap;
    struct stop_strings *stop;
    bool stopped; // a stop string matched
    struct chat_parser *parser;
    const char *finish;                   // "stop" / "length"; NULL while generating
    bool cancelled, shut_down, timed_out; // why it stopped early: client, server, --timeout
    int n_gen;
    char *force;    // text forced after </think> (tool_choice required / named)
    bool force_now; // generation paused to inject it
    int n_tool_calls;
    // non-streaming: the whole message; streaming: logprobs not yet sent
    char *reasoning, *content;
    size_t reasoning_len, content_len;
    cJSON *tool_calls, *logprobs;
};

static void append(char **buf, size_t *len, const char *s, size_t n) {
    *buf = xrealloc(*buf, *len + n + 1);
    memcpy(*buf + *len, s, n);
    *len += n;
    (*buf)[*len] = 0;
}

static void send_chunk(struct gen *g, cJSON *chunk) {
    char *s = cJSON_PrintUnformatted(chunk);
    cJSON_Delete(chunk);
    size_t n = strlen(s);
    char *line = xmalloc(n + 9);
    memcpy(line, "data: ", 6);
    memcpy(line + 6, s, n);
    memcpy(line + 6 + n, "\n\n", 3);
    job_emit(g->j, line, n + 8);
    free(line);
    free(s);
}

static cJSON *choice0(cJSON *chunk) {
    return cJSON_GetArrayItem(cJSON_GetObjectItem(chunk, "choices"), 0);
}

// A streamed delta; carries the logprobs of the tokens since the previous chunk.
static cJSON *delta_chunk(struct gen *g, cJSON **delta) {
    cJSON *c = oai_chunk(g->sv, g->j), *c0 = choice0(c);
    *delta = cJSON_GetObjectItem(c0, "delta");
    if (g->logprobs && cJSON_GetArraySize(g->logprobs)) {
        cJSON *lp = cJSON_CreateObject();
        cJSON_AddItemToObject(lp, "content", g->logprobs);
        cJSON_ReplaceItemInObject(c0, "logprobs", lp);
        g->logprobs = cJSON_CreateArray();
    }
    return c;
}

static void on_event(void *ud, const struct chat_event *ev) {
    struct gen *g = ud;
    bool stream = g->j->req.stream;
    if (ev->kind == CHAT_TOOL_CALL) {
        char id[64];
        snprintf(id, sizeof id, "call_%s_%d", g->j->id + 9, g->n_tool_calls++);
        if (!stream) {
            cJSON_AddItemToArray(g->tool_calls,
                                 oai_tool_call(-1, id, ev->tool_name, ev->arguments));
            return;
        }
        cJSON *delta, *c = delta_chunk(g, &delta),
                      *arr = cJSON_AddArrayToObject(delta, "tool_calls");
        cJSON_AddItemToArray(arr, oai_tool_call(ev->tool_index, id, ev->tool_name, ev->arguments));
        send_chunk(g, c);
        return;
    }
    if (ev->len == 0) return;
    bool reasoning = ev->kind == CHAT_REASONING;
    if (!stream) {
        if (reasoning)
            append(&g->reasoning, &g->reasoning_len, ev->text, ev->len);
        else
            append(&g->content, &g->content_len, ev->text, ev->len);
        return;
    }
    char *text = xmalloc(ev->len + 1);
    memcpy(text, ev->text, ev->len);
    text[ev->len] = 0;
    cJSON *delta, *c = delta_chunk(g, &delta);
    cJSON_AddStringToObject(delta, reasoning ? "reasoning_content" : "content", text);
    free(text);
    send_chunk(g, c);
}

static void to_parser(void *ud, const char *text, size_t len) {
    struct gen *g = ud;
    chat_parser_feed(g->parser, text, len, on_event, g);
}

// Generated text -> stop filter -> chat parser -> events. True when a stop sequence matched.
static bool push_text(struct gen *g, const char *text, size_t len) {
    return g->stopped = stop_strings_push(g->stop, text, len, to_parser, g);
}

static bool push_token_text(struct gen *g, int32_t id) {
    size_t n = detok_push(g->sv->tok, &g->dt, id, g->text, g->text_cap);
    return push_text(g, g->text, n);
}

static int on_token(void *ud, const struct sampled_token *t) {
    struct gen *g = ud;
    struct job *j = g->j;
    if (atomic_load(&j->cancel)) return g->cancelled = true, 1;
    if (atomic_load(&g->sv->shutdown_now)) return g->shut_down = true, 1;
    if (now_sec() > j->deadline) return g->timed_out = true, 1;
    g->n_gen++;
    if (eos_set_has(&g->sv->eos, t->id)) return g->finish = "stop", 1;
    if (j->req.logprobs) cJSON_AddItemToArray(g->logprobs, oai_logprob(g->sv->tok, t));
    if (push_token_text(g, t->id)) return g->finish = "stop", 1;
    if (g->force && t->id == g->sv->think_end) return g->force_now = true, 1;
    return 0;
}

static struct sampler_params request_sampling(const struct server *sv,
                                              const struct oai_request *r) {
    struct sampler_params p = sv->gen_defaults;
    sampler_params_overlay(&p, &r->sampling, r->set);
    if (!(r->set & SAMPLER_SET_SEED)) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        p.seed = (uint64_t)ts.tv_nsec * 0x9e3779b97f4a7c15ull ^ (uint64_t)ts.tv_sec;
    }
    p.n_vocab = tokenizer_n_vocab(sv->tok);
    p.n_logprobs = r->logprobs ? r->top_logprobs : -1;
    return p;
}

// Feeds text the server writes on the model's behalf (a forced tool-call opening): it joins
// the sequence and goes through the same output path as generated text.
static int inject(struct gen *g, const char *text, struct wren_err *e) {
    int32_t *ids = NULL;
    int n = tokenizer_encode(g->sv->tok, text, strlen(text), &ids, e);
    if (n < 0) return -1;
    int rc = g->j->req.replay
                 ? 0
                 : wren_session_feed(g->sv->session, ids, n, NULL, false, NULL, NULL, e);
    for (int i = 0; i < n && !rc; i++) push_token_text(g, ids[i]);
    g->n_gen += n;
    free(ids);
    return rc;
}

// The tool_choice opening: "<tool_call>\n<function=NAME>\n" forces that function, and
// "<tool_call>\n<function=" forces some call.
static char *forced_text(const struct oai_request *r) {
    if (r->tool_choice == TOOL_CHOICE_NAMED) {
        size_t n = strlen(r->tool_name) + 64;
        char *s = xmalloc(n);
        snprintf(s, n, "<tool_call>\n<function=%s>\n", r->tool_name);
        return s;
    }
    if (r->tool_choice == TOOL_CHOICE_REQUIRED) return xstrdup("<tool_call>\n<function=");
    return NULL;
}

// Generation paused at </think>: the forced tool-call opening follows the usual blank line.
static int inject_forced(struct gen *g, struct wren_err *e) {
    g->force_now = false;
    size_t n = strlen(g->force) + 3;
    char *text = xmalloc(n);
    snprintf(text, n, "\n\n%s", g->force);
    free(g->force);
    g->force = NULL;
    int rc = inject(g, text, e);
    free(text);
    return rc;
}

// Replays the test-only text as if the model had generated it, token by token.
static int replay(struct gen *g, int max_new, struct wren_err *e) {
    int32_t *ids = NULL;
    int n = tokenizer_encode(g->sv->tok, g->j->req.replay, strlen(g->j->req.replay), &ids, e);
    if (n < 0) return -1;
    int i = 0, rc = 0;
    for (; i < n && g->n_gen < max_new; i++) {
        struct sampled_token t = {.id = ids[i]};
        if (!on_token(g, &t)) continue;
        if (!g->force_now || (rc = inject_forced(g, e))) break;
    }
    if (rc) {
        free(ids);
        return -1;
    }
    if (i == n && !g->finish) g->finish = "stop"; // the replayed text ends like an end token
    free(ids);
    return 0;
}

static int generate(struct gen *g, int max_new, struct wren_err *e) {
    const struct oai_request *r = &g->j->req;
    if (g->force && !g->j->in_reasoning) {
        if (inject(g, g->force, e)) return -1;
        free(g->force);
        g->force = NULL;
    }
    if (r->replay) return replay(g, max_new, e);
    struct sampler_params sp = request_sampling(g->sv, r);
    while (!g->finish && !g->cancelled && !g->shut_down && !g->timed_out && g->n_gen < max_new) {
        int n_out = 0;
        if (wren_session_generate(g->sv->session, &sp, max_new - g->n_gen, on_token, g, &n_out, e))
            return -1;
        if (!g->force_now) break;
        if (inject_forced(g, e)) return -1;
        sp.seed++;
    }
    return 0;
}

// Prefill of prompt[resume..n): in segments of the backend's prefill chunk (the granularity at
// which a prefill notices cancellation), saving snapshots at the turn start (with KV) and every
// snapshot_every tokens (without KV).
static int prefill(struct server *sv, struct job *j, int resume, struct wren_err *e) {
    int pos = resume, every = sv->o.snapshot_every;
    const int segment = wren_engine_prefill_chunk(sv->engine);
    while (pos < j->n_prompt) {
        if (atomic_load(&j->cancel) || atomic_load(&sv->shutdown_now) || now_sec() > j->deadline)
            return 1;
        int end = j->n_prompt;
        if (end - pos > segment) end = pos + segment;
        int next_snap = every > 0 ? (pos / every + 1) * every : end;
        bool at_turn = j->turn_start > pos && j->turn_start < end;
        if (at_turn) end = j->turn_start;
        if (next_snap < end) end = next_snap;
        if (wren_session_feed(sv->session, j->prompt + pos, end - pos, NULL, false, NULL, NULL, e))
            return -1;
        pos = end;
        if (pos < j->n_prompt && (pos == j->turn_start || (every > 0 && pos % every == 0)))
            snap_cache_save(sv->cache, sv->session, pos == j->turn_start);
    }
    return 0;
}

static char *final_body(struct gen *g, int cached, const char *finish) {
    struct job *j = g->j;
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "id", j->id);
    cJSON_AddStringToObject(root, "object", "chat.completion");
    cJSON_AddNumberToObject(root, "created", (double)j->created);
    cJSON_AddStringToObject(root, "model", g->sv->model_name);
    cJSON_AddStringToObject(root, "system_fingerprint", "wren");
    cJSON *choices = cJSON_AddArrayToObject(root, "choices"), *c0 = cJSON_CreateObject();
    cJSON_AddItemToArray(choices, c0);
    cJSON_AddNumberToObject(c0, "index", 0);
    cJSON *m = cJSON_AddObjectToObject(c0, "message");
    cJSON_AddStringToObject(m, "role", "assistant");
    bool calls = cJSON_GetArraySize(g->tool_calls) > 0;
    if (g->content_len || !calls)
        cJSON_AddStringToObject(m, "content", g->content ? g->content : "");
    else
        cJSON_AddNullToObject(m, "content");
    if (g->reasoning_len) cJSON_AddStringToObject(m, "reasoning_content", g->reasoning);
    if (calls) {
        cJSON_AddItemToObject(m, "tool_calls", g->tool_calls);
        g->tool_calls = NULL;
    }
    if (j->req.logprobs) {
        cJSON *lp = cJSON_AddObjectToObject(c0, "logprobs");
        cJSON_AddItemToObject(lp, "content", g->logprobs);
        g->logprobs = NULL;
    } else {
        cJSON_AddNullToObject(c0, "logprobs");
    }
    cJSON_AddStringToObject(c0, "finish_reason", finish);
    cJSON_AddItemToObject(root, "usage", oai_usage(j->n_prompt, g->n_gen, cached));
    char *s = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    return s;
}

// Ends the job with an error: the JSON body of a non-streaming response, or, in a stream whose
// 200 has gone out, an error event followed by [DONE] (the stream still ends properly, and
// OpenAI clients raise the error).
static void fail(struct job *j, int status, const char *type, const char *msg) {
    struct oai_error err;
    oai_errorf(&err, status, type, NULL, "%s", msg);
    char *body = oai_error_body(&err);
    if (j->req.stream) {
        size_t n = strlen(body) + 32;
        char *line = xmalloc(n);
        snprintf(line, n, "data: %s\n\ndata: [DONE]\n\n", body);
        job_emit(j, line, strlen(line));
        free(line);
        free(body);
        job_finish(j, status, NULL);
    } else {
        job_finish(j, status, body);
    }
}

// A job stopped before its end: its client left (nothing to answer), the server is shutting
// down (503), or it ran past --timeout (504). `phase` names where, for the message.
static void end_early(struct server *sv, struct job *j, bool client_left, bool shut_down,
                      const char *phase) {
    char msg[128];
    if (client_left) {
        job_finish(j, 499, NULL);
    } else if (shut_down) {
        fail(j, 503, "server_error", "the server is shutting down");
    } else {
        snprintf(msg, sizeof msg, "the request timed out during %s (--timeout)", phase);
        fail(j, 504, "timeout", msg);
    }
    metrics_request(&sv->metrics, OUT_CANCELLED);
}

static void report_cache(struct server *sv, int hit) {
    size_t bytes;
    int entries;
    snap_cache_stats(sv->cache, &bytes, &entries);
    metrics_cache(&sv->metrics, hit, bytes, entries);
}

static void run_job(struct server *sv, struct job *j) {
    struct wren_err e = {0};
    struct gen g = {.sv = sv, .j = j};
    double t0 = now_sec();
    int cached = snap_cache_resume(sv->cache, sv->session, j->prompt, j->n_prompt, &e);
    report_cache(sv, cached > 0);
    if (cached < 0) {
        fail(j, 500, "server_error", e.msg);
        metrics_request(&sv->metrics, OUT_SERVER_ERROR);
        return;
    }
    int rc = prefill(sv, j, cached, &e);
    double t1 = now_sec();
    if (rc < 0) {
        wren_session_reset(sv->session); // a failed engine call may have left partial state
        fail(j, 500, "server_error", e.msg);
        metrics_request(&sv->metrics, OUT_SERVER_ERROR);
        return;
    }
    if (rc) {
        end_early(sv, j, atomic_load(&j->cancel), atomic_load(&sv->shutdown_now),
                  "prompt processing");
        return;
    }

    int room = sv->n_ctx - j->n_prompt;
    int max_new = j->req.max_tokens > 0 ? j->req.max_tokens : sv->o.max_tokens_default;
    if (max_new <= 0 || max_new > room) max_new = room;
    g.stop = stop_strings_new((const char *const *)j->req.stop, j->req.n_stop);
    g.parser = chat_parser_new(j->req.tools, j->in_reasoning);
    g.force = forced_text(&j->req);
    g.text_cap = detok_out_cap(sv->tok);
    g.text = xmalloc(g.text_cap);
    g.tool_calls = cJSON_CreateArray();
    g.logprobs = cJSON_CreateArray();
    if (j->req.stream) {
        cJSON *delta, *c = delta_chunk(&g, &delta);
        cJSON_AddStringToObject(delta, "role", "assistant");
        cJSON_AddStringToObject(delta, "content", "");
        send_chunk(&g, c);
    }
    rc = generate(&g, max_new, &e);
    double t2 = now_sec();
    // Flush what the detokenizer, the stop filter and the parser still hold.
    size_t n = detok_flush(&g.dt, g.text, g.text_cap);
    if (!g.stopped) push_text(&g, g.text, n);
    stop_strings_flush(g.stop, to_parser, &g);
    chat_parser_finish(g.parser, on_event, &g);
    metrics_generation(&sv->metrics, j->n_prompt, cached, j->n_prompt - cached, t1 - t0, g.n_gen,
                       t2 - t1);

    const char *finish = g.finish ? g.finish : "length";
    if (g.n_tool_calls && !strcmp(finish, "stop")) finish = "tool_calls";
    if (rc) {
        wren_session_reset(sv->session); // partial state must not be resumed from
        fail(j, 500, "server_error", e.msg);
        metrics_request(&sv->metrics, OUT_SERVER_ERROR);
    } else if (g.cancelled || g.shut_down || g.timed_out) {
        end_early(sv, j, g.cancelled, g.shut_down, "generation");
    } else if (j->req.stream) {
        cJSON *delta, *c = delta_chunk(&g, &delta);
        cJSON_ReplaceItemInObject(choice0(c), "finish_reason", cJSON_CreateString(finish));
        send_chunk(&g, c);
        if (j->req.include_usage) {
            c = oai_chunk(sv, j);
            cJSON_ReplaceItemInObject(c, "choices", cJSON_CreateArray());
            cJSON_AddItemToObject(c, "usage", oai_usage(j->n_prompt, g.n_gen, cached));
            send_chunk(&g, c);
        }
        job_emit(j, "data: [DONE]\n\n", 14);
        job_finish(j, 200, NULL);
        metrics_request(&sv->metrics, OUT_OK);
    } else {
        job_finish(j, 200, final_body(&g, cached, finish));
        metrics_request(&sv->metrics, OUT_OK);
    }
    chat_parser_free(g.parser);
    stop_strings_free(g.stop);
    free(g.force);
    free(g.text);
    free(g.reasoning);
    free(g.content);
    cJSON_Delete(g.tool_calls);
    cJSON_Delete(g.logprobs);
}

void *worker_main(void *arg) {
    struct server *sv = arg;
    struct job *j;
    while ((j = queue_pop(&sv->queue))) {
        if (atomic_load(&j->cancel)) {
            job_finish(j, 499, NULL);
            metrics_request(&sv->metrics, OUT_CANCELLED);
        } else {
            metrics_busy(&sv->metrics, 1);
            job_start(j);
            run_job(sv, j);
            report_cache(sv, -1); // the snapshots this job saved
            metrics_busy(&sv->metrics, 0);
        }
        job_release(j);
    }
    atomic_store(&sv->worker_done, true);
    return NULL;
}
