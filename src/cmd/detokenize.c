// wren detokenize: token ids -> text, through the streaming detokenizer the engine uses.
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cmd/cmd.h"
#include "text/tokenizer.h"
#include "util/util.h"

#define MAX_FILES 4096

struct detokenize_opts {
    const char *model;
    const char *files[MAX_FILES];
    int n_files;
    char **ids; // positional ids
    int n_ids;
    bool json, skip_special;
};

static void usage(FILE *f) {
    fprintf(f, "usage: wren detokenize -m DIR [--ids-file F.json]... [IDS...]\n"
               "Prints the text of the token ids (arguments, a JSON array file, or stdin).\n"
               "  -m, --model DIR     directory with tokenizer.json (or the file itself)\n"
               "  --ids-file F        JSON array of ids; repeat for several files\n"
               "  --json              print each text as a JSON string on its own line\n"
               "  --skip-special      leave out special tokens (<|im_end|>, ...)\n");
}

static int parse(struct detokenize_opts *o, int argc, char **argv) {
    o->ids = xmalloc(sizeof(char *) * (size_t)argc);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            exit(0);
        } else if (!strcmp(a, "-m") || !strcmp(a, "--model") || !strncmp(a, "--model=", 8)) {
            if (!(v = opt_value(argc, argv, &i))) return -1;
            o->model = v;
        } else if (!strcmp(a, "--ids-file") || !strncmp(a, "--ids-file=", 11)) {
            if (!(v = opt_value(argc, argv, &i))) return -1;
            if (o->n_files == MAX_FILES) {
                fprintf(stderr, "wren detokenize: at most %d --ids-file\n", MAX_FILES);
                return -1;
            }
            o->files[o->n_files++] = v;
        } else if (!strcmp(a, "--json")) {
            o->json = true;
        } else if (!strcmp(a, "--skip-special")) {
            o->skip_special = true;
        } else if (a[0] == '-' && a[1]) {
            fprintf(stderr, "wren detokenize: unknown option %s\n", a);
            return -1;
        } else {
            o->ids[o->n_ids++] = argv[i];
        }
    }
    if (!o->model) {
        fprintf(stderr, "wren detokenize: -m DIR is required (the directory of tokenizer.json)\n");
        return -1;
    }
    if (o->n_ids && o->n_files) {
        fprintf(stderr, "wren detokenize: give IDS or --ids-file, not both\n");
        return -1;
    }
    return 0;
}

// Ids given as arguments: "1 2 3", "1,2,3" or "[1, 2, 3]" all work.
static int parse_id_args(char **args, int n, int **out, struct wren_err *e) {
    size_t cap = 16, k = 0;
    int *ids = xmalloc(cap * sizeof *ids);
    for (int i = 0; i < n; i++) {
        const char *p = args[i];
        for (;;) {
            while (*p == ' ' || *p == ',' || *p == '[' || *p == ']' || *p == '\n' || *p == '\t')
                p++;
            if (!*p) break;
            char *end;
            errno = 0;
            long v = strtol(p, &end, 10);
            if (end == p || errno || v < 0 || v > INT32_MAX) {
                free(ids);
                return wren_errf(e, "'%s' is not a list of non-negative token ids", args[i]);
            }
            if (k == cap) ids = xrealloc(ids, (cap *= 2) * sizeof *ids);
            ids[k++] = (int)v;
            p = end;
        }
    }
    *out = ids;
    return (int)k;
}

// The text as one JSON string line (the detokenizer's output is valid UTF-8, NULs included).
static void print_json_string(const char *s, size_t n) {
    putchar('"');
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '"' || c == '\\')
            printf("\\%c", c);
        else if (c == '\n')
            fputs("\\n", stdout);
        else if (c < 0x20)
            printf("\\u%04x", c);
        else
            putchar(c);
    }
    fputs("\"\n", stdout);
}

static int decode_print(const struct tokenizer *t, const struct detokenize_opts *o, const int *ids,
                        int n, const char *what) {
    int n_vocab = tokenizer_n_vocab(t);
    for (int i = 0; i < n; i++)
        if (ids[i] >= n_vocab || !tokenizer_token_bytes(t, ids[i], NULL)) {
            fprintf(stderr,
                    "wren detokenize: %s: token id %d (element %d) is not in the vocabulary "
                    "(valid ids: 0..%d)\n",
                    what, ids[i], i, n_vocab - 1);
            return -1;
        }
    size_t cap = detok_out_cap(t), len = 0, room = cap + 64;
    char *text = xmalloc(room);
    struct detok d = {0};
    for (int i = 0; i < n; i++) {
        if (o->skip_special && tokenizer_is_special(t, ids[i])) continue;
        if (len + cap > room) text = xrealloc(text, room = 2 * (len + cap));
        len += detok_push(t, &d, ids[i], text + len, cap);
    }
    if (len + cap > room) text = xrealloc(text, room = len + cap);
    len += detok_flush(&d, text + len, cap);
    if (o->json) {
        print_json_string(text, len);
    } else {
        fwrite(text, 1, len, stdout);
    }
    free(text);
    return 0;
}

int cmd_detokenize(int argc, char **argv) {
    struct detokenize_opts o = {0};
    if (parse(&o, argc, argv)) {
        usage(stderr);
        free(o.ids);
        return 2;
    }
    struct wren_err e = {0};
    struct tokenizer *t = tokenizer_load(o.model, &e);
    if (!t) {
        fprintf(stderr, "wren detokenize: %s\n", e.msg);
        free(o.ids);
        return 1;
    }
    int rc = 0, *ids = NULL, n;
    if (o.n_ids || !o.n_files) {
        n = o.n_ids ? parse_id_args(o.ids, o.n_ids, &ids, &e)
                    : read_tokens_json("/dev/stdin", &ids, &e);
        if (n < 0) {
            fprintf(stderr, "wren detokenize: %s\n", e.msg);
            rc = -1;
        } else {
            rc = decode_print(t, &o, ids, n, o.n_ids ? "IDS" : "stdin");
        }
        free(ids);
    }
    for (int i = 0; i < o.n_files && !rc; i++) {
        n = read_tokens_json(o.files[i], &ids, &e);
        if (n < 0) {
            fprintf(stderr, "wren detokenize: %s\n", e.msg);
            rc = -1;
            break;
        }
        rc = decode_print(t, &o, ids, n, o.files[i]);
        free(ids);
    }
    tokenizer_free(t);
    free(o.ids);
    if (fflush(stdout)) rc = -1;
    return rc ? 1 : 0;
}
