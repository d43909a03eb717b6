// Several threads encoding at once (the server does) get the same ids as one thread alone: the
// shared word cache is held by one call at a time, the others encode without it.
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "text/tokenizer.h"
#include "util/util.h"

#define THREADS 4
#define ROUNDS  40

static const struct tokenizer *tok;
static char *text;
static size_t text_len;
static int32_t *want;
static int n_want;

static void *worker(void *arg) {
    long bad = 0;
    for (int r = 0; r < ROUNDS; r++) {
        struct wren_err e = {0};
        int32_t *ids;
        // Alternate whole text and a prefix so calls overlap with different contents.
        size_t len = (r + (long)arg) % 2 ? text_len : text_len / 3;
        int n = tokenizer_encode(tok, text, len, &ids, &e);
        if (n < 0) {
            bad++;
            continue;
        }
        if (len == text_len && (n != n_want || memcmp(ids, want, (size_t)n * sizeof *ids))) bad++;
        free(ids);
    }
    return (void *)bad;
}

int main(int argc, char **argv) {
    char path[4096];
    const char *src = argc > 1 ? argv[1] : ".";
    snprintf(path, sizeof path, "%s/data/tokenizers/qwen3", src);
    struct wren_err e = {0};
    struct tokenizer *t = tokenizer_load(path, &e);
    if (!t) {
        fprintf(stderr, "cannot load %s: %s\n", path, e.msg);
        return 1;
    }
    tok = t;
    // Varied text: the chat template (markup, specials) repeated with a counter.
    snprintf(path, sizeof path, "%s/data/chat_templates/qwen3.6.jinja", src);
    size_t n;
    char *tpl = read_file(path, &n, &e);
    if (!tpl) {
        fprintf(stderr, "%s\n", e.msg);
        return 1;
    }
    text = xmalloc(50 * (n + 32));
    for (int i = 0; i < 50; i++) {
        text_len += (size_t)sprintf(text + text_len, "<|im_start|>%d 你好 ", i * 7919);
        memcpy(text + text_len, tpl, n);
        text_len += n;
    }
    n_want = tokenizer_encode(t, text, text_len, &want, &e);
    if (n_want <= 0) {
        fprintf(stderr, "encode failed: %s\n", e.msg);
        return 1;
    }
    pthread_t th[THREADS];
    for (long i = 0; i < THREADS; i++) pthread_create(&th[i], NULL, worker, (void *)i);
    long bad = 0;
    for (int i = 0; i < THREADS; i++) {
        void *r;
        pthread_join(th[i], &r);
        bad += (long)r;
    }
    free(want);
    free(text);
    free(tpl);
    tokenizer_free(t);
    if (bad) {
        fprintf(stderr, "FAIL: %ld concurrent encodes differ from the single-thread result\n", bad);
        return 1;
    }
    printf("tok_threads: %d threads x %d encodes agree\n", THREADS, ROUNDS);
    return 0;
}
