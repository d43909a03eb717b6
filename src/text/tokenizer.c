// Placeholder until the tokenizer lands.
#include "text/tokenizer.h"

#include <stddef.h>

struct tokenizer *tokenizer_load(const char *dir, struct wren_err *e) {
    wren_errf(e, "%s: tokenizer not implemented yet", dir);
    return NULL;
}
void tokenizer_free(struct tokenizer *t) {
    (void)t;
}
int tokenizer_encode(const struct tokenizer *t, const char *text, size_t len, int32_t **ids,
                     struct wren_err *e) {
    (void)t, (void)text, (void)len, (void)ids;
    return wren_errf(e, "tokenizer not implemented yet");
}
