// The end-of-sequence set that `wren run`, `wren chat` and `wren serve` all stop on: the union
// of generation_config.json's eos_token_id, config.json's and the chat format's end tokens.
#include <stdio.h>
#include <string.h>

#include "engine/gen_config.h"
#include "model/config.h"
#include "text/tokenizer.h"
#include "check.h"

int main(int argc, char **argv) {
    char path[4096];
    snprintf(path, sizeof path, "%s/data/tokenizers/qwen3", argc > 1 ? argv[1] : ".");
    struct wren_err e = {{0}};
    struct tokenizer *t = tokenizer_load(path, &e);
    if (!t) {
        fprintf(stderr, "eos_set: %s\n", e.msg);
        return 1;
    }
    int32_t im_end = tokenizer_token_id(t, "<|im_end|>");
    int32_t endoftext = tokenizer_token_id(t, "<|endoftext|>");
    CHECK(im_end >= 0 && endoftext >= 0, "the Qwen3 tokenizer has the chat end tokens");

    struct eos_set s;
    eos_set_build(&s, NULL, NULL, t);
    CHECK(s.n == 2 && eos_set_has(&s, im_end) && eos_set_has(&s, endoftext),
          "without configs: the chat end tokens (%d ids)", s.n);
    CHECK(!eos_set_has(&s, 5), "an id nobody listed is not an end");

    // generation_config.json lists an extra id (and one of the chat ends), config.json another.
    struct gen_config gc;
    const char *json = "{\"eos_token_id\": [5, 151645]}";
    CHECK(gen_config_parse(json, strlen(json), "generation_config.json", &gc, &e) == 0, "%s",
          e.msg);
    struct model_config mc;
    memset(&mc, 0, sizeof mc);
    mc.n_eos = 2;
    mc.eos[0] = 7;
    mc.eos[1] = 5;
    eos_set_build(&s, &gc, &mc, t);
    CHECK(s.n == 4, "union without duplicates: %d ids", s.n);
    CHECK(eos_set_has(&s, 5) && eos_set_has(&s, 7) && eos_set_has(&s, im_end) &&
              eos_set_has(&s, endoftext),
          "every listed id ends a generation");
    CHECK(!eos_set_has(&s, 6), "an unlisted id does not");
    tokenizer_free(t);
    return check_finish("eos_set");
}
