// Model loading and one generation turn for `wren run` and `wren chat` (see gen_common.h).
#include "cmd/gen_common.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "engine/gen_config.h"
#include "text/stop_strings.h"
#include "util/util.h"

#define ANSI_DIM   "\x1b[2m"
#define ANSI_RESET "\x1b[0m"

// Without --seed every run differs, like other engines; the seed mixes the clock and the pid.
static uint64_t fresh_seed(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    uint64_t x =
        (uint64_t)ts.tv_sec * 1000000007ull ^ (uint64_t)ts.tv_nsec ^ ((uint64_t)getpid() << 32);
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    return x ^ (x >> 33);
}

static void merge_sampling(struct gen *g, const struct gen_config *gc) {
    const struct gen_opts *o = g->o;
    const struct sampler_params *c = &o->sampling;
    struct sampler_params *p = &g->sampling;
    *p = gc->sampling;
    sampler_params_overlay(p, c, o->set);
    if (!(o->set & SAMPLER_SET_SEED)) p->seed = fresh_seed();
    p->n_vocab = tokenizer_n_vocab(g->tok);
    p->n_logprobs = -1;
}

int gen_open(struct gen *g, const struct gen_opts *o, struct wren_err *e) {
    memset(g, 0, sizeof *g);
    g->o = o;
    g->out_tty = isatty(1);
    const char *dir = o->engine.model_dir;
    if (!dir) return wren_errf(e, "no model given: pass -m DIR (a checkpoint directory)");
    struct gen_config gc;
    if (gen_config_load(dir, &gc, e)) return -1;
    if (!(g->tok = tokenizer_load(dir, e))) return wren_err_prefix(e, "loading the tokenizer: ");
    if (progress_enabled()) fprintf(stderr, "loading %s ...", dir);
    g->en = wren_engine_open(&o->engine, e);
    if (progress_enabled()) fprintf(stderr, "\r\x1b[K");
    if (!g->en) goto fail;
    if (!(g->s = wren_session_new(g->en, 0, e))) goto fail;
    g->flavor = chat_flavor_detect(dir);
    merge_sampling(g, &gc);
    eos_set_build(&g->eos, &gc, wren_engine_config(g->en), g->tok);
    if (o->log_path && !(g->log = fopen(o->log_path, "a"))) {
        wren_errf(e, "--log %s: cannot open for writing", o->log_path);
        goto fail;
    }
    return 0;
fail:
    gen_close(g);
    return -1;
}

void gen_reset(struct gen *g) {
    if (g->snap) wren_snapshot_free(g->snap);
    g->snap = NULL;
    wren_session_reset(g->s);
}

void gen_close(struct gen *g) {
    if (g->snap) wren_snapshot_free(g->snap);
    if (g->s) wren_session_free(g->s);
    if (g->en) wren_engine_close(g->en);
    if (g->tok) tokenizer_free(g->tok);
    if (g->log) fclose(g->log);
    memset(g, 0, sizeof *g);
}

void turn_out_free(struct turn_out *t) {
    free(t->reasoning);
    free(t->content);
    memset(t, 0, sizeof *t);
}

// ---- streaming the reply ----

struct text {
    char *s;
    size_t n, cap;
};
static void text_add(struct text *t, const char *s, size_t n) {
    if (t->n + n + 1 > t->cap) {
        t->cap = 2 * (t->n + n + 1);
        t->s = xrealloc(t->s, t->cap);
    }
    memcpy(t->s + t->n, s, n);
    t->n += n;
    t->s[t->n] = 0;
}

struct stream {
    struct gen *g;
    struct detok dt;
    struct stop_strings *stops;
    struct chat_parser *parser; // NULL: raw text, all content
    char *buf;
    size_t cap;
    struct text reasoning, content;
    int32_t *ids;
    int n_ids, cap_ids;
    bool dim;      // the terminal is in dim mode (reasoning shown inline)
    bool stop_hit; // a stop string ended the reply: the text after it is dropped
    const char *finish;
};

static void show(struct stream *st, bool reasoning, const char *s, size_t n) {
    if (!n) return;
    struct gen *g = st->g;
    text_add(reasoning ? &st->reasoning : &st->content, s, n);
    if (reasoning && !g->out_tty) {
        fwrite(s, 1, n, stderr);
        return;
    }
    if (g->out_tty && reasoning != st->dim) {
        fputs(reasoning ? ANSI_DIM : ANSI_RESET, stdout);
        st->dim = reasoning;
    }
    fwrite(s, 1, n, stdout);
}

static void on_event(void *ud, const struct chat_event *ev) {
    struct stream *st = ud;
    if (ev->kind == CHAT_TOOL_CALL) { // no tools are offered here; shown as text for the user
        char line[512];
        int n = snprintf(line, sizeof line, "[tool call %s]", ev->tool_name ? ev->tool_name : "?");
        show(st, false, line, (size_t)n < sizeof line ? (size_t)n : sizeof line - 1);
        if (ev->arguments) show(st, false, ev->arguments, strlen(ev->arguments));
        return;
    }
    show(st, ev->kind == CHAT_REASONING, ev->text, ev->len);
}

// Text that passed the stop strings.
static void on_text(void *ud, const char *s, size_t n) {
    struct stream *st = ud;
    if (st->parser)
        chat_parser_feed(st->parser, s, n, on_event, st);
    else
        show(st, false, s, n);
}

static int on_token(void *ud, const struct sampled_token *t) {
    struct stream *st = ud;
    struct gen *g = st->g;
    if (st->n_ids == st->cap_ids) {
        st->cap_ids = st->cap_ids ? 2 * st->cap_ids : 256;
        st->ids = xrealloc(st->ids, sizeof(int32_t) * (size_t)st->cap_ids);
    }
    st->ids[st->n_ids++] = t->id;
    if (g->interrupted && *g->interrupted) {
        st->finish = "interrupted";
        return 1;
    }
    if (eos_set_has(&g->eos, t->id)) {
        st->finish = "stop";
        return 1;
    }
    size_t len = 0;
    tokenizer_token_bytes(g->tok, t->id, &len);
    size_t need = 3 * (len + sizeof st->dt.pending) + 16; // invalid bytes grow to U+FFFD
    if (need > st->cap) st->buf = xrealloc(st->buf, st->cap = need);
    size_t n = detok_push(g->tok, &st->dt, t->id, st->buf, st->cap);
    if (stop_strings_push(st->stops, st->buf, n, on_text, st)) {
        st->stop_hit = true;
        st->finish = "stop";
        return 1;
    }
    fflush(stdout);
    return 0;
}

static void stream_finish(struct stream *st) {
    if (!st->stop_hit) { // pass on what is held back
        char tail[64];
        size_t n = detok_flush(&st->dt, tail, sizeof tail);
        if (!stop_strings_push(st->stops, tail, n, on_text, st))
            stop_strings_flush(st->stops, on_text, st);
    }
    if (st->parser) chat_parser_finish(st->parser, on_event, st);
    if (st->dim) fputs(ANSI_RESET, stdout);
    st->dim = false;
    fputc('\n', stdout);
    if (!st->g->out_tty && st->reasoning.n) fputc('\n', stderr);
    fflush(stdout);
}

// ---- reusing the session's state ----

static int common_prefix(const int32_t *a, int na, const int32_t *b, int nb) {
    int i = 0;
    while (i < na && i < nb && a[i] == b[i]) i++;
    return i;
}

// Brings the session to a state that is a prefix of ids (at least one token short, so that
// feeding produces the next logits) and returns its length.
static int reuse_state(struct gen *g, const int32_t *ids, int n, struct wren_err *e) {
    int len = wren_session_len(g->s);
    int lcp = common_prefix(wren_session_tokens(g->s), len, ids, n);
    if (lcp == len && len < n) return len;
    if (g->snap) {
        int sl = wren_snapshot_len(g->snap);
        // Restoring without the KV cache needs the session to still hold the snapshot's tokens
        // (sl <= lcp) and the snapshot to be a prefix of the new prompt.
        if (sl <= lcp && sl < n && common_prefix(wren_snapshot_tokens(g->snap), sl, ids, n) == sl) {
            if (wren_session_restore(g->s, g->snap, e)) return -1;
            return sl;
        }
    }
    wren_session_reset(g->s);
    return 0;
}

struct prefill_progress {
    int offset, total;
};
static void on_prefill(void *ud, int done, int total) {
    (void)total;
    const struct prefill_progress *p = ud;
    progress("prefill", (size_t)(p->offset + done), (size_t)p->total);
}

static int feed(struct gen *g, const int32_t *ids, int from, int to, struct prefill_progress *pp,
                struct wren_err *e) {
    if (to <= from) return 0;
    pp->offset = from;
    bool show = pp->total - from >= 256;
    return wren_session_feed(g->s, ids + from, to - from, NULL, false, show ? on_prefill : NULL, pp,
                             e);
}

static void log_turn(struct gen *g, const struct cJSON *messages, const int32_t *prompt,
                     int n_prompt, const struct stream *st, const struct turn_out *out) {
    if (!g->log) return;
    cJSON *o = cJSON_CreateObject();
    if (messages) cJSON_AddItemToObject(o, "messages", cJSON_Duplicate(messages, 1));
    cJSON *p = cJSON_AddArrayToObject(o, "prompt");
    for (int i = 0; i < n_prompt; i++) cJSON_AddItemToArray(p, cJSON_CreateNumber(prompt[i]));
    cJSON *gen = cJSON_AddArrayToObject(o, "generated");
    for (int i = 0; i < st->n_ids; i++) cJSON_AddItemToArray(gen, cJSON_CreateNumber(st->ids[i]));
    cJSON_AddNumberToObject(o, "reused", out->n_reused);
    cJSON_AddStringToObject(o, "finish", out->finish);
    cJSON_AddStringToObject(o, "reasoning", out->reasoning);
    cJSON_AddStringToObject(o, "content", out->content);
    char *s = cJSON_PrintUnformatted(o);
    fprintf(g->log, "%s\n", s);
    fflush(g->log);
    free(s);
    cJSON_Delete(o);
}

// ids[0, n): the prompt; snap_at (0: none) where to keep a snapshot for the next turn.
static int run_turn(struct gen *g, const int32_t *ids, int n, int snap_at, bool parse,
                    bool in_reasoning, const struct cJSON *messages, struct turn_out *out,
                    struct wren_err *e) {
    memset(out, 0, sizeof *out);
    int max_ctx = wren_session_max_ctx(g->s);
    if (n < 1) return wren_errf(e, "the prompt is empty");
    if (n >= max_ctx)
        return wren_errf(e, "the prompt has %d tokens but the context holds %d (see --ctx)", n,
                         max_ctx);
    int reused = reuse_state(g, ids, n, e);
    if (reused < 0) return -1;
    double t0 = now_sec();
    struct prefill_progress pp = {0, n};
    if (snap_at > reused && snap_at < n) {
        if (feed(g, ids, reused, snap_at, &pp, e)) return -1;
        struct wren_snapshot *snap = wren_session_snapshot(g->s, false, e);
        if (!snap) return -1;
        if (g->snap) wren_snapshot_free(g->snap);
        g->snap = snap;
    }
    int from = snap_at > reused && snap_at < n ? snap_at : reused;
    if (feed(g, ids, from, n, &pp, e)) return -1;
    double t1 = now_sec();

    struct stream st = {.g = g};
    st.stops = stop_strings_new(g->o->stop, g->o->n_stop);
    if (parse) st.parser = chat_parser_new(NULL, in_reasoning);
    int max_new = max_ctx - n;
    if (g->o->max_tokens > 0 && g->o->max_tokens < max_new) max_new = g->o->max_tokens;
    int n_gen = 0;
    int rc = wren_session_generate(g->s, &g->sampling, max_new, on_token, &st, &n_gen, e);
    double t2 = now_sec();
    stream_finish(&st);
    if (!st.finish) st.finish = "length";
    out->reasoning = st.reasoning.s ? st.reasoning.s : xstrdup("");
    out->content = st.content.s ? st.content.s : xstrdup("");
    out->n_prompt = n;
    out->n_reused = reused;
    out->n_gen = n_gen;
    out->t_prefill = t1 - t0;
    out->t_gen = t2 - t1;
    out->finish = st.finish;
    if (rc == 0) log_turn(g, messages, ids, n, &st, out);
    stop_strings_free(st.stops);
    chat_parser_free(st.parser);
    free(st.buf);
    free(st.ids);
    if (rc) turn_out_free(out);
    return rc;
}

static int render(struct gen *g, const cJSON *messages, bool think, bool gen_prompt, char **out,
                  struct wren_err *e) {
    cJSON *req = cJSON_CreateObject();
    cJSON_AddItemToObject(req, "messages", cJSON_Duplicate(messages, 1));
    cJSON *kw = cJSON_AddObjectToObject(req, "chat_template_kwargs");
    cJSON_AddBoolToObject(kw, "enable_thinking", think);
    int rc = chat_render(req, g->flavor, gen_prompt, out, e);
    cJSON_Delete(req);
    return rc;
}

int gen_chat_turn(struct gen *g, const cJSON *messages, bool think, struct turn_out *out,
                  struct wren_err *e) {
    char *full = NULL, *hist = NULL;
    int32_t *ids = NULL, *hids = NULL;
    int rc = -1, n, nh = 0;
    if (render(g, messages, think, true, &full, e)) goto done;
    if ((n = tokenizer_encode(g->tok, full, strlen(full), &ids, e)) < 0) goto done;
    // The conversation without the generation prompt: where the next turn's rendering will
    // still agree with this one (see gen_common.h).
    int snap_at = 0;
    if (g->snapshots && !render(g, messages, think, false, &hist, e) &&
        (nh = tokenizer_encode(g->tok, hist, strlen(hist), &hids, e)) > 0 &&
        common_prefix(hids, nh, ids, n) == nh)
        snap_at = nh;
    rc = run_turn(g, ids, n, snap_at, true, chat_prompt_in_reasoning(full), messages, out, e);
done:
    free(full);
    free(hist);
    free(ids);
    free(hids);
    return rc;
}

int gen_raw_turn(struct gen *g, const char *text, struct turn_out *out, struct wren_err *e) {
    int32_t *ids = NULL;
    int n = tokenizer_encode(g->tok, text, strlen(text), &ids, e);
    if (n < 0) return -1;
    int rc = run_turn(g, ids, n, 0, false, false, NULL, out, e);
    free(ids);
    return rc;
}

void turn_summary(const struct turn_out *t, bool with_reuse) {
    int fresh = t->n_prompt - t->n_reused;
    double pf = t->t_prefill > 0 ? fresh / t->t_prefill : 0;
    double dc = t->t_gen > 0 ? t->n_gen / t->t_gen : 0;
    const char *why = !strcmp(t->finish, "interrupted") ? ", interrupted" : "";
    if (with_reuse)
        fprintf(stderr,
                "[prompt %d tokens: prefilled %d new tokens, %d reused, %.1f tok/s | generated %d "
                "tokens, %.1f tok/s%s]\n",
                t->n_prompt, fresh, t->n_reused, pf, t->n_gen, dc, why);
    else
        fprintf(
            stderr,
            "[prompt %d tokens, prefill %.1f tok/s | generated %d tokens, decode %.1f tok/s%s]\n",
            t->n_prompt, pf, t->n_gen, dc, why);
}
