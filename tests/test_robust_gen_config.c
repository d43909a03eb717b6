// generation_config.json: the values of a real Qwen3.6 file, HF's do_sample semantics, a missing
// file, and malformed files that must give an error message instead of a crash.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine/gen_config.h"
#include "check.h"

static int parse(const char *json, struct gen_config *gc, struct wren_err *e) {
    return gen_config_parse(json, strlen(json), "generation_config.json", gc, e);
}

int main(void) {
    struct gen_config gc;
    struct wren_err e = {{0}};
    const char *qwen = "{\"bos_token_id\": 248044, \"do_sample\": true, \"eos_token_id\": "
                       "[248046, 248044], \"pad_token_id\": 248044, \"temperature\": 1.0, "
                       "\"top_k\": 20, \"top_p\": 0.95, \"transformers_version\": \"4.57.0\"}";
    CHECK(parse(qwen, &gc, &e) == 0, "qwen config: %s", e.msg);
    CHECK(gc.found && gc.sampling.temperature == 1.0f && gc.sampling.top_k == 20 &&
              gc.sampling.top_p == 0.95f && gc.sampling.min_p == 0 &&
              gc.sampling.repetition_penalty == 1.0f,
          "qwen sampling values");
    CHECK(gc.n_eos == 2 && gc.eos[0] == 248046 && gc.eos[1] == 248044, "qwen eos ids");

    CHECK(parse("{\"do_sample\": false, \"temperature\": 0.7, \"eos_token_id\": 5, "
                "\"repetition_penalty\": 1.05, \"min_p\": 0.1}",
                &gc, &e) == 0,
          "greedy config: %s", e.msg);
    CHECK(gc.sampling.temperature == 0 && gc.n_eos == 1 && gc.eos[0] == 5 &&
              gc.sampling.repetition_penalty == 1.05f && gc.sampling.min_p == 0.1f,
          "do_sample false is greedy; single eos id");

    CHECK(parse("{}", &gc, &e) == 0 && gc.sampling.temperature == 1.0f && gc.n_eos == 0,
          "empty object keeps defaults");

    const char *bad[] = {
        "",
        "[1,2]",
        "{\"temperature\": \"hot\"}",
        "{\"temperature\": -1}",
        "{\"top_p\": 1.5}",
        "{\"top_k\": -3}",
        "{\"do_sample\": 1}",
        "{\"eos_token_id\": \"<|im_end|>\"}",
        "{\"eos_token_id\": [1, -2]}",
        "{\"eos_token_id\": [1.5]}",
        "{\"eos_token_id\": [1,2,3,4,5,6,7,8,9]}",
        "{\"temperature\": 1e999}",
        "{\"top_p\": 0.9,",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        e.msg[0] = 0;
        CHECK(parse(bad[i], &gc, &e) == -1 && strstr(e.msg, "generation_config.json"),
              "bad config %zu accepted or message lacks the file: '%s'", i, e.msg);
    }

    // Missing file: defaults, no error. A present file is read from the directory.
    char dir[] = "/tmp/wren_gencfg_XXXXXX";
    CHECK(mkdtemp(dir) != NULL, "mkdtemp");
    CHECK(gen_config_load(dir, &gc, &e) == 0 && !gc.found && gc.sampling.top_k == 0,
          "missing file");
    char path[256];
    snprintf(path, sizeof path, "%s/generation_config.json", dir);
    FILE *f = fopen(path, "w");
    fputs(qwen, f);
    fclose(f);
    CHECK(gen_config_load(dir, &gc, &e) == 0 && gc.found && gc.sampling.top_k == 20,
          "file in directory: %s", e.msg);
    unlink(path);
    rmdir(dir);

    return check_finish("gen_config");
}
