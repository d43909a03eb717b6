// Malformed tokenizer.json files and invalid input text: every one must be refused with a
// message, never a crash (this test also runs under AddressSanitizer + UBSan).
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "text/tokenizer.h"
#include "util/util.h"
#include "check.h"

static char dir[256];

static void write_file(const char *name, const char *data, size_t n) {
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(data, 1, n, f) != n) {
        perror(path);
        exit(1);
    }
    fclose(f);
}

// Loads `json` as DIR/tokenizer.json; returns the tokenizer or NULL (message in e).
static struct tokenizer *load_text(const char *json, size_t n, struct wren_err *e) {
    write_file("tokenizer.json", json, n);
    memset(e, 0, sizeof *e);
    return tokenizer_load(dir, e);
}

static void expect_refused(const char *json, const char *want, const char *what) {
    struct wren_err e;
    struct tokenizer *t = load_text(json, strlen(json), &e);
    CHECK(!t, "%s: accepted", what);
    CHECK(!t && e.msg[0], "%s: no message", what);
    CHECK(!t && (!want || strstr(e.msg, want)), "%s: message '%s' lacks '%s'", what, e.msg, want);
    tokenizer_free(t);
}

// A tiny valid tokenizer in Qwen's shape; %s slots let cases replace one part.
#define PRE_OK                                                                                     \
    "{\"type\":\"Sequence\",\"pretokenizers\":[{\"type\":\"Split\",\"pattern\":{\"Regex\":"        \
    "\" "                                                                                          \
    "?\\\\p{L}+|\\\\s+|\\\\S\"},\"behavior\":\"Isolated\",\"invert\":false},{\"type\":"            \
    "\"ByteLevel\","                                                                               \
    "\"add_prefix_space\":false,\"trim_offsets\":false,\"use_regex\":false}]}"
#define VOCAB_OK  "{\"a\":0,\"b\":1,\"ab\":2,\"\\u0120\":3,\"\\u0120ab\":4}"
#define MERGES_OK "[\"a b\",[\"\\u0120\",\"ab\"]]"
#define ADDED_OK                                                                                   \
    "[{\"id\":5,\"content\":\"<x>\",\"single_word\":false,\"lstrip\":false,\"rstrip\":false,"      \
    "\"normalized\":false,\"special\":true}]"

static char *make(const char *model_type, const char *vocab, const char *merges, const char *added,
                  const char *norm, const char *pre, const char *dec) {
    static char buf[8192];
    snprintf(buf, sizeof buf,
             "{\"version\":\"1.0\",\"added_tokens\":%s,\"normalizer\":%s,\"pre_tokenizer\":%s,"
             "\"decoder\":%s,\"model\":{\"type\":%s,\"byte_fallback\":false,\"vocab\":%s,"
             "\"merges\":%s}}",
             added, norm, pre, dec, model_type, vocab, merges);
    return buf;
}
#define OK_PARTS                                                                                   \
    "\"BPE\"", VOCAB_OK, MERGES_OK, ADDED_OK, "{\"type\":\"NFC\"}", PRE_OK,                        \
        "{\"type\":\"ByteLevel\"}"

int main(int argc, char **argv) {
    snprintf(dir, sizeof dir, "/tmp/wren_bad_tok_XXXXXX");
    if (!mkdtemp(dir)) {
        perror("mkdtemp");
        return 1;
    }
    struct wren_err e;

    // The tiny tokenizer works: "ab ab<x>" -> ab, Ġab, <x>.
    {
        const char *json = make(OK_PARTS);
        struct tokenizer *t = load_text(json, strlen(json), &e);
        CHECK(t, "tiny tokenizer refused: %s", e.msg);
        if (t) {
            int32_t *ids;
            int n = tokenizer_encode(t, "ab ab<x>", 8, &ids, &e);
            CHECK(n == 3 && ids[0] == 2 && ids[1] == 4 && ids[2] == 5, "tiny encode: n=%d", n);
            if (n >= 0) free(ids);
            // Bytes without a token are dropped (no byte fallback), not a crash.
            n = tokenizer_encode(t, "zz a", 4, &ids, &e);
            CHECK(n >= 0, "unknown bytes: %s", e.msg);
            if (n >= 0) free(ids);
            const char *bad[] = {"\xff",
                                 "ab\xc3",
                                 "\xed\xa0\x80",
                                 "\xc0\xaf",
                                 "a\x80"
                                 "b",
                                 "\xf4\x90\x80\x80"};
            for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
                e.msg[0] = 0;
                n = tokenizer_encode(t, bad[i], strlen(bad[i]), &ids, &e);
                CHECK(n == -1 && strstr(e.msg, "UTF-8") && !ids, "invalid UTF-8 #%zu accepted", i);
            }
            n = tokenizer_encode(t, "", 0, &ids, &e);
            CHECK(n == 0, "empty text: %d", n);
            if (n >= 0) free(ids);
            tokenizer_free(t);
        }
    }

    expect_refused("", "not valid JSON", "empty file");
    expect_refused("{not json", "not valid JSON", "garbage");
    expect_refused("\x01\x02\xff\xfe", "not valid JSON", "binary");
    expect_refused("[]", "object", "array at the top");
    expect_refused("null", "object", "null at the top");
    expect_refused("{}", "model", "missing model");
    expect_refused("{\"model\": 3}", "model", "model not an object");
    expect_refused(make("\"WordPiece\"", VOCAB_OK, MERGES_OK, ADDED_OK, "null", PRE_OK, "null"),
                   "WordPiece", "other model type");
    expect_refused(make("\"BPE\"", "[1,2]", MERGES_OK, ADDED_OK, "null", PRE_OK, "null"), "vocab",
                   "vocab not an object");
    expect_refused(make("\"BPE\"", "{}", "[]", "[]", "null", PRE_OK, "null"), "empty",
                   "empty vocab");
    expect_refused(make("\"BPE\"", "{\"a\":-1}", "[]", "[]", "null", PRE_OK, "null"), "id",
                   "negative id");
    expect_refused(make("\"BPE\"", "{\"a\":\"0\"}", "[]", "[]", "null", PRE_OK, "null"), "id",
                   "string id");
    expect_refused(make("\"BPE\"", "{\"a\":1.5}", "[]", "[]", "null", PRE_OK, "null"), "id",
                   "float id");
    expect_refused(make("\"BPE\"", "{\"a\":1e300}", "[]", "[]", "null", PRE_OK, "null"), "id",
                   "huge id");
    expect_refused(make("\"BPE\"", "{\"a\":0,\"b\":0}", "[]", "[]", "null", PRE_OK, "null"),
                   "two tokens", "duplicate id");
    expect_refused(make("\"BPE\"", VOCAB_OK, "{}", ADDED_OK, "null", PRE_OK, "null"), "merges",
                   "merges not an array");
    expect_refused(make("\"BPE\"", VOCAB_OK, "[\"a b c\"]", ADDED_OK, "null", PRE_OK, "null"),
                   "merge 0", "merge with three parts");
    expect_refused(make("\"BPE\"", VOCAB_OK, "[\"ab\"]", ADDED_OK, "null", PRE_OK, "null"),
                   "merge 0", "merge with one part");
    expect_refused(make("\"BPE\"", VOCAB_OK, "[[\"a\"]]", ADDED_OK, "null", PRE_OK, "null"),
                   "merge 0", "pair with one element");
    expect_refused(make("\"BPE\"", VOCAB_OK, "[[\"a\", 3]]", ADDED_OK, "null", PRE_OK, "null"),
                   "merge 0", "pair with a number");
    expect_refused(make("\"BPE\"", VOCAB_OK, "[\"a q\"]", ADDED_OK, "null", PRE_OK, "null"),
                   "missing", "merge of an unknown token");
    expect_refused(make("\"BPE\"", VOCAB_OK, "[\"b a\"]", ADDED_OK, "null", PRE_OK, "null"),
                   "missing", "merge result not in the vocabulary");
    expect_refused(make("\"BPE\"", VOCAB_OK, MERGES_OK, "{}", "null", PRE_OK, "null"),
                   "added_tokens", "added_tokens not an array");
    expect_refused(make("\"BPE\"", VOCAB_OK, MERGES_OK, "[{\"id\":5}]", "null", PRE_OK, "null"),
                   "content", "added token without content");
    expect_refused(make("\"BPE\"", VOCAB_OK, MERGES_OK, "[{\"id\":\"5\",\"content\":\"<x>\"}]",
                        "null", PRE_OK, "null"),
                   "id", "added token with a string id");
    expect_refused(make("\"BPE\"", VOCAB_OK, MERGES_OK,
                        "[{\"id\":5,\"content\":\"<x>\",\"special\":1}]", "null", PRE_OK, "null"),
                   "special", "flag not a bool");
    expect_refused(
        make("\"BPE\"", VOCAB_OK, MERGES_OK, ADDED_OK, "{\"type\":\"Lowercase\"}", PRE_OK, "null"),
        "Lowercase", "unsupported normalizer");
    expect_refused(make("\"BPE\"", VOCAB_OK, MERGES_OK, ADDED_OK, "null", "null", "null"),
                   "pre_tokenizer", "missing pre-tokenizer");
    expect_refused(
        make("\"BPE\"", VOCAB_OK, MERGES_OK, ADDED_OK, "null",
             "{\"type\":\"Sequence\",\"pretokenizers\":[{\"type\":\"Split\",\"pattern\":"
             "{\"Regex\":\"(unclosed\"},\"behavior\":\"Isolated\"},{\"type\":\"ByteLevel\","
             "\"add_prefix_space\":false,\"use_regex\":false}]}",
             "null"),
        "regex", "bad regex");
    expect_refused(make("\"BPE\"", VOCAB_OK, MERGES_OK, ADDED_OK, "null",
                        "{\"type\":\"Sequence\",\"pretokenizers\":[{\"type\":\"Split\",\"pattern\":"
                        "{\"Regex\":7},\"behavior\":\"Isolated\"},{\"type\":\"ByteLevel\","
                        "\"add_prefix_space\":false,\"use_regex\":false}]}",
                        "null"),
                   "pattern", "regex not a string");
    expect_refused(make("\"BPE\"", VOCAB_OK, MERGES_OK, ADDED_OK, "null",
                        "{\"type\":\"ByteLevel\",\"add_prefix_space\":false}", "null"),
                   "use_regex", "ByteLevel with the GPT-2 regex");
    expect_refused(make("\"BPE\"", VOCAB_OK, MERGES_OK, ADDED_OK, "null",
                        "{\"type\":\"Sequence\",\"pretokenizers\":\"x\"}", "null"),
                   "pretokenizers", "sequence not a list");
    expect_refused(
        make("\"BPE\"", VOCAB_OK, MERGES_OK, ADDED_OK, "null", PRE_OK, "{\"type\":\"WordPiece\"}"),
        "decoder", "unsupported decoder");

    // Truncations and byte flips of a valid file: refused or loaded, never a crash.
    {
        char json[8192];
        snprintf(json, sizeof json, "%s", make(OK_PARTS));
        size_t n = strlen(json);
        for (size_t cut = 0; cut < n; cut += 7) {
            struct tokenizer *t = load_text(json, cut, &e);
            CHECK(!t && e.msg[0], "truncated at %zu: accepted or no message", cut);
            tokenizer_free(t);
        }
        unsigned seed = 99;
        const char junk[] = "\"{}[],:0\\x\xff u";
        for (int round = 0; round < 400; round++) {
            char m[8192];
            memcpy(m, json, n);
            for (int k = 0; k < 3; k++)
                m[rand_r(&seed) % n] = junk[rand_r(&seed) % (sizeof junk - 1)];
            struct tokenizer *t = load_text(m, n, &e);
            if (t) {
                int32_t *ids;
                int k = tokenizer_encode(t, "ab ab<x> a", 10, &ids, &e);
                if (k >= 0) free(ids);
            } else {
                CHECK(e.msg[0], "mutation %d refused without a message", round);
            }
            tokenizer_free(t);
        }
    }

    // A missing directory and a directory without tokenizer.json.
    CHECK(!tokenizer_load("/nonexistent/wren/dir", &e) && strstr(e.msg, "nonexistent"),
          "missing dir");
    char path[512];
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    unlink(path);
    CHECK(!tokenizer_load(dir, &e) && strstr(e.msg, "tokenizer.json"), "dir without the file");

    // The real Qwen3 tokenizer: invalid UTF-8 is an error, detokenizing junk ids is harmless.
    snprintf(path, sizeof path, "%s/data/tokenizers/qwen3", argc > 1 ? argv[1] : ".");
    struct tokenizer *t = tokenizer_load(path, &e);
    CHECK(t, "qwen3 tokenizer: %s", e.msg);
    if (t) {
        int32_t *ids;
        const char *bad[] = {"hello \xff world", "<|im_start|>\xc3", "\xe4\xbd", "ok\xed\xbf\xbf"};
        for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
            CHECK(tokenizer_encode(t, bad[i], strlen(bad[i]), &ids, &e) == -1 &&
                      strstr(e.msg, "UTF-8"),
                  "qwen3: invalid UTF-8 #%zu accepted", i);
        size_t cap = detok_out_cap(t);
        char *out = xmalloc(cap);
        struct detok d = {.n_pending = 99};
        int32_t junk_ids[] = {-1, 0x7fffffff, tokenizer_n_vocab(t), 151643, 200, 201};
        for (size_t i = 0; i < sizeof junk_ids / sizeof *junk_ids; i++)
            CHECK(detok_push(t, &d, junk_ids[i], out, cap) <= cap, "detok overflow");
        CHECK(detok_flush(&d, out, cap) <= cap, "flush overflow");
        free(out);
        tokenizer_free(t);
    }
    rmdir(dir);
    return check_finish("bad_tokenizer");
}
