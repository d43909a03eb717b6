// Streaming detokenizer: multibyte characters split over tokens, ill-formed bytes (U+FFFD per
// maximal subpart), unknown ids, small output buffers; and streamed == one-shot on random bytes.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "text/tokenizer.h"
#include "text/utf8.h"
#include "check.h"

static int32_t byte_tok[256];

// Decodes a byte string fed as one token per byte; returns the output (static buffer).
static const char *stream_bytes(const struct tokenizer *t, const char *bytes, size_t n,
                                size_t *out_len) {
    static char out[4096];
    size_t k = 0, cap = detok_out_cap(t);
    struct detok d = {0};
    for (size_t i = 0; i < n; i++)
        k += detok_push(t, &d, byte_tok[(unsigned char)bytes[i]], out + k, cap);
    k += detok_flush(&d, out + k, cap);
    *out_len = k;
    return out;
}

static void expect(const struct tokenizer *t, const char *in, size_t n, const char *want,
                   const char *what) {
    size_t k;
    const char *got = stream_bytes(t, in, n, &k);
    CHECK(k == strlen(want) && !memcmp(got, want, k), "%s: got '%.*s' (%zu bytes), want '%s'", what,
          (int)k, got, k, want);
}

#define FFFD "\xEF\xBF\xBD"

// One-shot lossy decoding, the definition streaming must agree with.
static size_t lossy(const unsigned char *s, size_t n, char *out) {
    size_t i = 0, k = 0;
    while (i < n) {
        uint32_t cp;
        int bad, len = utf8_next(s + i, n - i, &cp, &bad);
        if (len > 0) {
            memcpy(out + k, s + i, (size_t)len);
            k += (size_t)len, i += (size_t)len;
        } else {
            memcpy(out + k, FFFD, 3);
            k += 3;
            i += bad > 0 ? (size_t)bad : n - i; // incomplete tail: one U+FFFD
        }
    }
    return k;
}

int main(int argc, char **argv) {
    char path[4096];
    snprintf(path, sizeof path, "%s/data/tokenizers/qwen3", argc > 1 ? argv[1] : ".");
    struct wren_err e = {0};
    struct tokenizer *t = tokenizer_load(path, &e);
    if (!t) {
        fprintf(stderr, "cannot load %s: %s\n", path, e.msg);
        return 1;
    }
    for (int b = 0; b < 256; b++) byte_tok[b] = -1;
    for (int32_t id = 0; id < tokenizer_n_vocab(t); id++) {
        size_t len;
        const char *s = tokenizer_token_bytes(t, id, &len);
        if (s && len == 1 && byte_tok[(unsigned char)s[0]] < 0) byte_tok[(unsigned char)s[0]] = id;
    }
    for (int b = 0; b < 256; b++) CHECK(byte_tok[b] >= 0, "no token for byte %d", b);

    expect(t, "\xE2\x82\xAC", 3, "\xE2\x82\xAC", "euro split in 3");
    expect(t, "a\xF0\x9F\x98\x80z", 6, "a\xF0\x9F\x98\x80z", "emoji split in 4");
    expect(t, "\xFF", 1, FFFD, "invalid lead byte");
    expect(t, "\xE2\x41", 2, FFFD "A", "truncated then ASCII");
    expect(t, "\xE2\x82", 2, FFFD, "truncated at the end (flush)");
    expect(t, "\xF0\x9F\xE2\x82\xAC", 5, FFFD "\xE2\x82\xAC", "truncated then a character");
    expect(t, "\xED\xA0\x80", 3, FFFD FFFD FFFD, "surrogate");
    expect(t, "\xC0\x80", 2, FFFD FFFD, "overlong");
    expect(t, "\xF4\x90\x80\x80", 4, FFFD FFFD FFFD FFFD, "past U+10FFFF");
    expect(t, "\x80\x80", 2, FFFD FFFD, "lone continuations");
    expect(t, "\xE0\x80", 2, FFFD FFFD, "E0 with a bad second byte");

    // The first token of a split character prints nothing, the last prints all of it.
    char out[4096];
    struct detok d = {0};
    size_t cap = detok_out_cap(t);
    CHECK(detok_push(t, &d, byte_tok[0xE4], out, cap) == 0, "held byte was printed");
    CHECK(d.n_pending == 1, "pending %d", d.n_pending);
    CHECK(detok_push(t, &d, byte_tok[0xBD], out, cap) == 0, "held byte was printed");
    size_t k = detok_push(t, &d, byte_tok[0xA0], out, cap);
    CHECK(k == 3 && !memcmp(out, "\xE4\xBD\xA0", 3), "CJK character not completed");
    CHECK(detok_flush(&d, out, cap) == 0, "flush after a complete character printed something");

    // Unknown ids add nothing; a tiny buffer is never overrun.
    CHECK(detok_push(t, &d, -5, out, cap) == 0, "negative id");
    CHECK(detok_push(t, &d, tokenizer_n_vocab(t) + 10, out, cap) == 0, "id past the vocabulary");
    int32_t hello = tokenizer_token_id(t, "Hello");
    CHECK(hello >= 0, "no 'Hello' token");
    memset(out, 'x', sizeof out);
    CHECK(detok_push(t, &d, hello, out, 2) == 2 && out[2] == 'x', "cap not respected");
    CHECK(tokenizer_token_id(t, "<|im_end|>") >= 0 &&
              tokenizer_is_special(t, tokenizer_token_id(t, "<|im_end|>")),
          "<|im_end|> not special");

    // Streamed token by token == one-shot lossy decoding, on random bytes and random tokens.
    unsigned seed = 12345;
    for (int round = 0; round < 2000; round++) {
        unsigned char bytes[64];
        int32_t ids[16];
        size_t nb = 0, ni = (size_t)(rand_r(&seed) % 16) + 1;
        for (size_t i = 0; i < ni; i++) {
            // Mostly bytes >= 0x80 to hit the interesting cases, sometimes whole tokens.
            if (rand_r(&seed) % 4 == 0)
                ids[i] = rand_r(&seed) % tokenizer_n_vocab(t);
            else
                ids[i] =
                    byte_tok[0x80 + rand_r(&seed) % 0x80 - (rand_r(&seed) % 8 == 0 ? 0x60 : 0)];
            size_t len;
            const char *s = tokenizer_token_bytes(t, ids[i], &len);
            if (!s || nb + len > sizeof bytes) {
                ni = i;
                break;
            }
            memcpy(bytes + nb, s, len);
            nb += len;
        }
        char streamed[1024], want[1024];
        struct detok s = {0};
        size_t ks = 0;
        for (size_t i = 0; i < ni; i++) ks += detok_push(t, &s, ids[i], streamed + ks, cap);
        ks += detok_flush(&s, streamed + ks, cap);
        size_t kw = lossy(bytes, nb, want);
        CHECK(ks == kw && !memcmp(streamed, want, ks), "round %d: streamed differs from one-shot",
              round);
        CHECK(utf8_valid_prefix(streamed, ks) == ks, "round %d: output is not valid UTF-8", round);
    }
    tokenizer_free(t);
    return check_finish("detok");
}
