// wren logits: teacher-forced logits of every position of a token sequence, written as
// little-endian float32 [T][vocab]. Used by the tests and by anyone checking numerics.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cmd/cmd.h"
#include "util/util.h"

struct logits_opts {
    struct wren_engine_opts eng;
    const char *tokens_file, *out;
    int decode_from; // > 0: prefill the first N tokens, then feed the rest one at a time
};

static void usage(void) {
    printf("usage: wren logits -m DIR --tokens-file F.json --out F.f32 [options]\n"
           "Writes the logits of every position as little-endian float32 "
           "[T][vocab].\n" OPT_ENGINE_HELP);
}

int cmd_logits(int argc, char **argv) {
    struct logits_opts o = {0};
    for (int i = 1; i < argc; i++) {
        int r = opt_engine(&o.eng, argc, argv, &i);
        if (r < 0) return 2;
        if (r) continue;
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) return usage(), 0;
        if (!strncmp(argv[i], "--tokens-file", 13)) {
            if (!(o.tokens_file = opt_value(argc, argv, &i))) return 2;
        } else if (!strncmp(argv[i], "--decode-from", 13)) {
            const char *v = opt_value(argc, argv, &i);
            if (!v || opt_int("--decode-from", v, 1, 1 << 24, &o.decode_from)) return 2;
        } else if (!strncmp(argv[i], "--out", 5)) {
            if (!(o.out = opt_value(argc, argv, &i))) return 2;
        } else {
            fprintf(stderr, "wren logits: unknown option '%s'\n", argv[i]);
            return 2;
        }
    }
    if (!o.eng.model_dir || !o.tokens_file || !o.out) {
        fprintf(stderr, "wren logits: -m, --tokens-file and --out are required\n");
        return 2;
    }
    struct wren_err e = {0};
    int *tok = NULL;
    int n = read_tokens_json(o.tokens_file, &tok, &e);
    if (n < 0) goto fail;
    if (n == 0) {
        wren_errf(&e, "%s: no tokens", o.tokens_file);
        goto fail;
    }
    if (o.eng.ctx < n) o.eng.ctx = n;
    struct wren_engine *en = wren_engine_open(&o.eng, &e);
    if (!en) goto fail;
    int vocab = wren_engine_config(en)->vocab;
    struct wren_session *s = wren_session_new(en, n, &e);
    float *logits = s ? malloc(sizeof(float) * (size_t)n * vocab) : NULL;
    int rc = -1;
    if (s && !logits)
        wren_errf(&e, "cannot allocate %zu bytes of logits", sizeof(float) * (size_t)n * vocab);
    int pre = o.decode_from > 0 && o.decode_from < n ? o.decode_from : n;
    bool ok =
        logits && !wren_session_feed(s, (const int32_t *)tok, pre, logits, true, NULL, NULL, &e);
    for (int t = pre; ok && t < n; t++)
        ok = !wren_session_feed(s, (const int32_t *)tok + t, 1, logits + (size_t)t * vocab, true,
                                NULL, NULL, &e);
    if (ok) {
        FILE *f = fopen(o.out, "wb");
        if (!f) {
            wren_errf(&e, "%s: cannot open for writing", o.out);
        } else {
            size_t want = (size_t)n * vocab;
            bool ok = fwrite(logits, sizeof(float), want, f) == want;
            if (fclose(f) || !ok)
                wren_errf(&e, "%s: write failed", o.out);
            else
                rc = 0;
        }
    }
    free(logits);
    wren_session_free(s);
    wren_engine_close(en);
    free(tok);
    if (!rc) return 0;
    fprintf(stderr, "wren logits: %s\n", e.msg);
    return 1;
fail:
    fprintf(stderr, "wren logits: %s\n", e.msg);
    free(tok);
    return 1;
}
