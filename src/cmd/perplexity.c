// wren perplexity: exp(mean negative log-likelihood) of a token sequence under the model, plus
// prompt-processing speed. Logits are computed window by window so memory stays bounded.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cmd/cmd.h"
#include "text/tokenizer.h"
#include "util/util.h"

struct ppl_opts {
    struct wren_engine_opts eng;
    const char *tokens_file, *text_file;
    int window; // positions whose logits are held at once
};

static void usage(void) {
    printf("usage: wren perplexity -m DIR (--tokens-file F.json | --text-file F.txt) [options]\n"
           "  --window N               logits rows held at once (default 64)\n" OPT_ENGINE_HELP);
}

// Tokens of a text file, with the model's tokenizer.
static int tokenize_file(const char *dir, const char *path, int **out, struct wren_err *e) {
    size_t len;
    char *text = read_file(path, &len, e);
    if (!text) return -1;
    struct tokenizer *t = tokenizer_load(dir, e);
    int32_t *ids = NULL;
    int n = t ? tokenizer_encode(t, text, len, &ids, e) : -1;
    tokenizer_free(t);
    free(text);
    *out = (int *)ids;
    return n;
}

int cmd_perplexity(int argc, char **argv) {
    struct ppl_opts o = {.window = 64};
    for (int i = 1; i < argc; i++) {
        int r = opt_engine(&o.eng, argc, argv, &i);
        if (r < 0) return 2;
        if (r) continue;
        const char *v;
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) return usage(), 0;
        if (!strncmp(argv[i], "--tokens-file", 13)) {
            if (!(o.tokens_file = opt_value(argc, argv, &i))) return 2;
        } else if (!strncmp(argv[i], "--text-file", 11)) {
            if (!(o.text_file = opt_value(argc, argv, &i))) return 2;
        } else if (!strncmp(argv[i], "--window", 8)) {
            if (!(v = opt_value(argc, argv, &i)) || opt_int("--window", v, 1, 1 << 16, &o.window))
                return 2;
        } else {
            fprintf(stderr, "wren perplexity: unknown option '%s'\n", argv[i]);
            return 2;
        }
    }
    if (!o.eng.model_dir || !o.tokens_file == !o.text_file) {
        fprintf(stderr,
                "wren perplexity: -m and one of --tokens-file / --text-file are required\n");
        return 2;
    }
    struct wren_err e = {0};
    int *tok = NULL;
    int n = o.tokens_file ? read_tokens_json(o.tokens_file, &tok, &e)
                          : tokenize_file(o.eng.model_dir, o.text_file, &tok, &e);
    struct wren_engine *en = NULL;
    struct wren_session *s = NULL;
    float *logits = NULL;
    int rc = 1;
    if (n < 0) goto out;
    if (n < 2) {
        wren_errf(&e, "need at least 2 tokens, got %d", n);
        goto out;
    }
    if (o.eng.ctx < n) o.eng.ctx = n;
    if (!(en = wren_engine_open(&o.eng, &e)) || !(s = wren_session_new(en, n, &e))) goto out;
    int vocab = wren_engine_config(en)->vocab;
    for (int i = 0; i < n; i++) // the last token is only a target, never fed: check all here
        if (tok[i] < 0 || tok[i] >= vocab) {
            wren_errf(&e, "token id %d at position %d is out of range [0, %d)", tok[i], i, vocab);
            goto out;
        }
    logits = xmalloc(sizeof(float) * (size_t)o.window * vocab);
    double nll = 0, t0 = now_sec();
    for (int p = 0; p < n - 1; p += o.window) {
        int m = n - 1 - p < o.window ? n - 1 - p : o.window;
        if (wren_session_feed(s, (const int32_t *)tok + p, m, logits, true, NULL, NULL, &e))
            goto out;
        for (int t = 0; t < m; t++) {
            const float *l = logits + (size_t)t * vocab;
            float mx = l[0];
            for (int j = 1; j < vocab; j++) mx = l[j] > mx ? l[j] : mx;
            double sum = 0;
            for (int j = 0; j < vocab; j++) sum += exp((double)l[j] - mx);
            nll += log(sum) + mx - l[tok[p + t + 1]];
        }
        progress("perplexity", (size_t)(p + m), (size_t)(n - 1));
    }
    double dt = now_sec() - t0;
    printf("tokens %d  perplexity %.4f  (%.1f tok/s, %s backend)\n", n, exp(nll / (n - 1)),
           (n - 1) / dt, wren_engine_backend(en));
    rc = 0;
out:
    if (rc) fprintf(stderr, "wren perplexity: %s\n", e.msg);
    free(logits);
    wren_session_free(s);
    wren_engine_close(en);
    free(tok);
    return rc;
}
