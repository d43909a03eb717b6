// Session semantics on a tiny synthesized model (CPU backend): snapshots with KV move between
// sessions; snapshots without KV only restore into a session that still holds their prefix;
// generation followed by more feeding equals feeding the whole sequence at once.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/engine.h"

static int failures;
#define CHECK(cond, ...)                                                                           \
    do {                                                                                           \
        if (cond) {                                                                                \
            printf("ok   " __VA_ARGS__);                                                           \
        } else {                                                                                   \
            printf("FAIL " __VA_ARGS__);                                                           \
            failures++;                                                                            \
        }                                                                                          \
        printf("\n");                                                                              \
    } while (0)

static int same(const float *a, const float *b, int n) {
    return !memcmp(a, b, sizeof(float) * n);
}

static int greedy(void *ud, const struct sampled_token *t) {
    (void)ud, (void)t;
    return 0;
}

int main(void) {
    const char *bin = getenv("WREN_BIN");
    char dir[] = "/tmp/wren_session_XXXXXX", cmd[512];
    if (!bin || !mkdtemp(dir)) return fprintf(stderr, "need WREN_BIN and a temp dir\n"), 1;
    snprintf(cmd, sizeof cmd, "%s synth --preset tiny --layers 4 --force --out %s > /dev/null", bin,
             dir);
    if (system(cmd)) return fprintf(stderr, "synth failed\n"), 1;

    struct wren_err e = {0};
    struct wren_engine_opts o = {
        .model_dir = dir, .backend = "cpu", .threads = 2, .prefill_chunk = 64};
    struct wren_engine *en = wren_engine_open(&o, &e);
    if (!en) return fprintf(stderr, "%s\n", e.msg), 1;
    int V = wren_engine_config(en)->vocab, N = 300, M = 12;
    int32_t tok[400];
    for (int i = 0; i < 400; i++) tok[i] = (i * 7919 + 13) % 1000;
    float *la = malloc(sizeof(float) * M * V), *lb = malloc(sizeof(float) * M * V);

    struct wren_session *a = wren_session_new(en, 1024, &e), *b = wren_session_new(en, 1024, &e);
    CHECK(a && b && !wren_session_feed(a, tok, N, NULL, false, NULL, NULL, &e), "feed %d tokens",
          N);
    struct wren_snapshot *nokv = wren_session_snapshot(a, false, &e);
    struct wren_snapshot *kv = wren_session_snapshot(a, true, &e);
    CHECK(nokv && kv && wren_snapshot_len(kv) == N, "snapshots of %d tokens", N);

    CHECK(wren_session_restore(b, nokv, &e) == -1 && strstr(e.msg, "without KV"),
          "a KV-less snapshot is refused by a session without its prefix (%s)", e.msg);
    CHECK(!wren_session_restore(b, kv, &e) && wren_session_len(b) == N,
          "a snapshot with KV restores into another session");
    wren_session_feed(a, tok + N, M, la, true, NULL, NULL, &e);
    wren_session_feed(b, tok + N, M, lb, true, NULL, NULL, &e);
    CHECK(same(la, lb, M * V), "continuing both sessions gives identical logits");

    // a holds the prefix of nokv (it moved on by M tokens): restoring it is valid
    CHECK(!wren_session_restore(a, nokv, &e) && wren_session_len(a) == N,
          "KV-less restore in place");
    wren_session_feed(a, tok + N, M, la, true, NULL, NULL, &e);
    CHECK(same(la, lb, M * V), "after the KV-less restore the continuation is identical");

    // generate 5 greedy tokens, then feed 3 more: the same as feeding everything in one go
    struct sampler_params p = {
        .temperature = 0, .top_p = 1, .repetition_penalty = 1, .n_vocab = V, .n_logprobs = -1};
    int made = 0;
    CHECK(!wren_session_generate(a, &p, 5, greedy, NULL, &made, &e) && made == 5, "generate 5");
    int n = wren_session_len(a);
    int32_t *seq = malloc(sizeof(int32_t) * (n + 3));
    memcpy(seq, wren_session_tokens(a), sizeof(int32_t) * n);
    memcpy(seq + n, tok + 100, sizeof(int32_t) * 3);
    wren_session_feed(a, tok + 100, 3, la, true, NULL, NULL, &e);
    wren_session_reset(b);
    float *all = malloc(sizeof(float) * (size_t)(n + 3) * V);
    CHECK(!wren_session_feed(b, seq, n + 3, all, true, NULL, NULL, &e), "feed the whole sequence");
    CHECK(same(la, all + (size_t)n * V, 3 * V), "generate + feed equals one feed of the sequence");

    wren_snapshot_free(nokv), wren_snapshot_free(kv);
    wren_session_free(a), wren_session_free(b);
    wren_engine_close(en);
    free(la), free(lb), free(seq), free(all);
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd)) failures++;
    printf("%d failed\n", failures);
    return failures != 0;
}
