// wren bench: prefill speed at given prompt lengths and decode speed at given context lengths,
// with the ratio to the physical limit (bytes moved per decode token, FLOPs per prefill).
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "cmd/cmd.h"
#include "util/util.h"

#define MAX_LENS 32

struct bench_opts {
    struct wren_engine_opts eng;
    int prefill[MAX_LENS], n_prefill;
    int decode[MAX_LENS], n_decode;
    int gen;    // tokens generated per decode measurement
    int repeat; // measurements per length (best is reported)
    const char *json;
    struct sampler_params sampling; // decode's sampler: greedy unless a sampling option is given
};

static void usage(void) {
    printf("usage: wren bench -m DIR [--prefill 256,1K,...] [--decode 256,1K,...] [options]\n"
           "  --gen N                  tokens generated per decode measurement (default 64)\n"
           "  --repeat N               runs per length, the best is reported (default 2)\n"
           "  --json FILE              also write the results as JSON\n"
           "  --temp T, --top-k K, --top-p P, --min-p P\n"
           "                           decode with this sampler instead of greedy (the cheapest)\n"
           "                           to measure what sampling costs; seed 1\n" OPT_ENGINE_HELP);
}

// Deterministic pseudo-random prompt ids below the model's vocabulary.
static void fill_tokens(int32_t *t, int n, int vocab) {
    uint64_t x = 0x2545F4914F6CDD1Dull;
    for (int i = 0; i < n; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        t[i] = (int32_t)(x % (uint64_t)(vocab < 100000 ? vocab : 100000));
    }
}

struct result {
    int len;
    double sec, tok_s, ratio; // ratio: TFLOP/s for prefill, GB/s for decode
};

static int run_prefill(struct wren_engine *en, int len, int repeat, struct result *r,
                       struct wren_err *e) {
    int32_t *tok = xmalloc(sizeof(int32_t) * (size_t)len);
    fill_tokens(tok, len, wren_engine_config(en)->vocab);
    r->len = len, r->sec = 1e30;
    int rc = 0;
    for (int k = 0; k < repeat && !rc; k++) {
        struct wren_session *s = wren_session_new(en, len + 1, e);
        if (!s) {
            rc = -1;
            break;
        }
        double t0 = now_sec();
        rc = wren_session_feed(s, tok, len, NULL, false, NULL, NULL, e);
        double dt = now_sec() - t0;
        if (dt < r->sec) r->sec = dt;
        wren_session_free(s);
    }
    r->tok_s = len / r->sec;
    r->ratio = wren_engine_prefill_flops(en, len) / r->sec / 1e12;
    free(tok);
    return rc;
}

static int count_cb(void *ud, const struct sampled_token *t) {
    (void)ud, (void)t;
    return 0;
}

static int run_decode(struct wren_engine *en, const struct sampler_params *sp, int ctx, int gen,
                      int repeat, struct result *r, struct wren_err *e) {
    int32_t *tok = xmalloc(sizeof(int32_t) * (size_t)ctx);
    fill_tokens(tok, ctx, wren_engine_config(en)->vocab);
    r->len = ctx, r->sec = 1e30;
    struct wren_session *s = wren_session_new(en, ctx + gen * repeat + 2, e);
    int rc = s ? wren_session_feed(s, tok, ctx, NULL, false, NULL, NULL, e) : -1;
    struct sampler_params p = *sp;
    p.n_vocab = wren_engine_config(en)->vocab;
    // Untimed warm-up: a generation leaves its last token unfed, and the next one feeds it first,
    // so after this every timed call runs exactly one forward pass per token it returns.
    int warm = 0;
    if (!rc) rc = wren_session_generate(s, &p, 1, count_cb, NULL, &warm, e);
    for (int k = 0; k < repeat && !rc; k++) {
        int made = 0;
        double t0 = now_sec();
        rc = wren_session_generate(s, &p, gen, count_cb, NULL, &made, e);
        double dt = (now_sec() - t0) / (made ? made : 1);
        if (dt < r->sec) r->sec = dt;
    }
    r->tok_s = 1.0 / r->sec;
    r->ratio = wren_engine_decode_bytes(en, ctx) / r->sec / 1e9;
    wren_session_free(s);
    free(tok);
    return rc;
}

static int write_json(const char *path, struct wren_engine *en, const struct sampler_params *sp,
                      const struct result *pre, int n_pre, const struct result *dec, int n_dec) {
    cJSON *root = cJSON_CreateObject(), *arr;
    cJSON_AddStringToObject(root, "model", wren_engine_model_dir(en));
    cJSON_AddStringToObject(root, "backend", wren_engine_backend(en));
    cJSON_AddNumberToObject(root, "weight_bytes", (double)wren_engine_weight_bytes(en));
    arr = cJSON_AddArrayToObject(root, "prefill");
    for (int i = 0; i < n_pre; i++) {
        cJSON *r = cJSON_CreateObject();
        cJSON_AddNumberToObject(r, "tokens", pre[i].len);
        cJSON_AddNumberToObject(r, "seconds", pre[i].sec);
        cJSON_AddNumberToObject(r, "tok_s", pre[i].tok_s);
        cJSON_AddNumberToObject(r, "tflops", pre[i].ratio);
        cJSON_AddItemToArray(arr, r);
    }
    cJSON *smp = cJSON_AddObjectToObject(root, "decode_sampler");
    cJSON_AddNumberToObject(smp, "temperature", sp->temperature);
    cJSON_AddNumberToObject(smp, "top_k", sp->top_k);
    cJSON_AddNumberToObject(smp, "top_p", sp->top_p);
    cJSON_AddNumberToObject(smp, "min_p", sp->min_p);
    arr = cJSON_AddArrayToObject(root, "decode");
    for (int i = 0; i < n_dec; i++) {
        cJSON *r = cJSON_CreateObject();
        cJSON_AddNumberToObject(r, "context", dec[i].len);
        cJSON_AddNumberToObject(r, "ms_per_token", dec[i].sec * 1e3);
        cJSON_AddNumberToObject(r, "tok_s", dec[i].tok_s);
        cJSON_AddNumberToObject(r, "bytes_per_token", wren_engine_decode_bytes(en, dec[i].len));
        cJSON_AddNumberToObject(r, "gb_s", dec[i].ratio);
        cJSON_AddItemToArray(arr, r);
    }
    char *text = cJSON_Print(root);
    cJSON_Delete(root);
    FILE *f = text ? fopen(path, "w") : NULL;
    int rc = f && fputs(text, f) >= 0 && fputc('\n', f) != EOF ? 0 : -1;
    if (f && fclose(f)) rc = -1;
    free(text);
    return rc;
}

int cmd_bench(int argc, char **argv) {
    struct bench_opts o = {.gen = 64, .repeat = 2, .sampling = sampler_defaults()};
    o.sampling.temperature = 0; // greedy: the cheapest sampler, so the number is the model's
    o.sampling.seed = 1;
    for (int i = 1; i < argc; i++) {
        int r = opt_engine(&o.eng, argc, argv, &i);
        if (r < 0) return 2;
        if (r) continue;
        const char *v;
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) return usage(), 0;
        if (!strncmp(argv[i], "--prefill", 9)) {
            if (!(v = opt_value(argc, argv, &i)) ||
                (o.n_prefill = opt_int_list("--prefill", v, o.prefill, MAX_LENS)) < 0)
                return 2;
        } else if (!strncmp(argv[i], "--decode", 8)) {
            if (!(v = opt_value(argc, argv, &i)) ||
                (o.n_decode = opt_int_list("--decode", v, o.decode, MAX_LENS)) < 0)
                return 2;
        } else if (!strncmp(argv[i], "--gen", 5)) {
            if (!(v = opt_value(argc, argv, &i)) || opt_int("--gen", v, 1, 1 << 20, &o.gen))
                return 2;
        } else if (!strncmp(argv[i], "--repeat", 8)) {
            if (!(v = opt_value(argc, argv, &i)) || opt_int("--repeat", v, 1, 100, &o.repeat))
                return 2;
        } else if (!strncmp(argv[i], "--json", 6)) {
            if (!(o.json = opt_value(argc, argv, &i))) return 2;
        } else if (!strncmp(argv[i], "--temp", 6)) {
            if (!(v = opt_value(argc, argv, &i)) ||
                opt_float_in("--temp", v, 0, 100, &o.sampling.temperature))
                return 2;
        } else if (!strncmp(argv[i], "--top-k", 7)) {
            if (!(v = opt_value(argc, argv, &i)) ||
                opt_int("--top-k", v, 0, 1 << 30, &o.sampling.top_k))
                return 2;
        } else if (!strncmp(argv[i], "--top-p", 7)) {
            if (!(v = opt_value(argc, argv, &i)) ||
                opt_float_in("--top-p", v, 1e-6f, 1, &o.sampling.top_p))
                return 2;
        } else if (!strncmp(argv[i], "--min-p", 7)) {
            if (!(v = opt_value(argc, argv, &i)) ||
                opt_float_in("--min-p", v, 0, 1, &o.sampling.min_p))
                return 2;
        } else {
            fprintf(stderr, "wren bench: unknown option '%s'\n", argv[i]);
            return 2;
        }
    }
    if (!o.eng.model_dir) {
        fprintf(stderr, "wren bench: -m DIR is required\n");
        return 2;
    }
    if (!o.n_prefill && !o.n_decode) {
        o.n_prefill = opt_int_list("--prefill", "256,1024", o.prefill, MAX_LENS);
        o.n_decode = opt_int_list("--decode", "256,1024", o.decode, MAX_LENS);
    }
    int max_len = 0;
    for (int i = 0; i < o.n_prefill; i++) max_len = o.prefill[i] > max_len ? o.prefill[i] : max_len;
    for (int i = 0; i < o.n_decode; i++)
        max_len = o.decode[i] + o.gen * o.repeat + 2 > max_len ? o.decode[i] + o.gen * o.repeat + 2
                                                               : max_len;
    if (o.eng.ctx < max_len + 1) o.eng.ctx = max_len + 1;

    struct wren_err e = {0};
    struct wren_engine *en = wren_engine_open(&o.eng, &e);
    if (!en) {
        fprintf(stderr, "wren bench: %s\n", e.msg);
        return 1;
    }
    struct result pre[MAX_LENS], dec[MAX_LENS];
    printf("model %s  backend %s  weights %.2f GB  active per token %.3f GB\n",
           wren_engine_model_dir(en), wren_engine_backend(en), wren_engine_weight_bytes(en) / 1e9,
           wren_engine_decode_bytes(en, 0) / 1e9);
    int rc = 0;
    if (o.n_prefill) printf("%-10s %12s %12s %10s\n", "prefill", "tokens/s", "seconds", "TFLOP/s");
    for (int i = 0; i < o.n_prefill && !rc; i++) {
        rc = run_prefill(en, o.prefill[i], o.repeat, &pre[i], &e);
        if (!rc)
            printf("%-10d %12.1f %12.4f %10.2f\n", pre[i].len, pre[i].tok_s, pre[i].sec,
                   pre[i].ratio);
        fflush(stdout);
    }
    if (o.n_decode && !rc) {
        const struct sampler_params *sp = &o.sampling;
        if (sp->temperature > 0)
            printf("sampler: temperature %g, top-k %d, top-p %g, min-p %g\n", sp->temperature,
                   sp->top_k, sp->top_p, sp->min_p);
        printf("%-10s %12s %12s %10s\n", "decode@ctx", "tokens/s", "ms/token", "GB/s");
    }
    for (int i = 0; i < o.n_decode && !rc; i++) {
        rc = run_decode(en, &o.sampling, o.decode[i], o.gen, o.repeat, &dec[i], &e);
        if (!rc)
            printf("%-10d %12.1f %12.3f %10.1f\n", dec[i].len, dec[i].tok_s, dec[i].sec * 1e3,
                   dec[i].ratio);
        fflush(stdout);
    }
    if (rc) fprintf(stderr, "wren bench: %s\n", e.msg);
    if (!rc && o.json && write_json(o.json, en, &o.sampling, pre, o.n_prefill, dec, o.n_decode)) {
        fprintf(stderr, "wren bench: cannot write %s\n", o.json);
        rc = -1;
    }
    wren_engine_close(en);
    return rc ? 1 : 0;
}
