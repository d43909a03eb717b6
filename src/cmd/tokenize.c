// wren tokenize: text -> token ids as a JSON array. Needs only the tokenizer files.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cmd/cmd.h"
#include "text/tokenizer.h"
#include "util/util.h"

#define MAX_FILES 4096

struct tokenize_opts {
    const char *model;
    const char *text;
    const char *files[MAX_FILES];
    int n_files;
    bool bench;
};

static void usage(FILE *f) {
    fprintf(f, "usage: wren tokenize -m DIR [--text-file F]... [TEXT]\n"
               "Prints the token ids of TEXT (or of the file, or of stdin) as a JSON array.\n"
               "  -m, --model DIR     directory with tokenizer.json (or the file itself)\n"
               "  --text-file F       read the text from F; repeat for several files: one\n"
               "                      JSON array per line, in order\n"
               "  --bench             time loading and encoding (of F, or of stdin) instead\n");
}

static int parse(struct tokenize_opts *o, int argc, char **argv) {
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            exit(0);
        } else if (!strcmp(a, "-m") || !strcmp(a, "--model") || !strncmp(a, "--model=", 8)) {
            if (!(v = opt_value(argc, argv, &i))) return -1;
            o->model = v;
        } else if (!strcmp(a, "--text-file") || !strncmp(a, "--text-file=", 12)) {
            if (!(v = opt_value(argc, argv, &i))) return -1;
            if (o->n_files == MAX_FILES) {
                fprintf(stderr, "wren tokenize: at most %d --text-file\n", MAX_FILES);
                return -1;
            }
            o->files[o->n_files++] = v;
        } else if (!strcmp(a, "--bench")) {
            o->bench = true;
        } else if (a[0] == '-' && a[1]) {
            fprintf(stderr, "wren tokenize: unknown option %s\n", a);
            return -1;
        } else if (o->text) {
            fprintf(stderr, "wren tokenize: give the text as one argument (quote it)\n");
            return -1;
        } else {
            o->text = a;
        }
    }
    if (!o->model) {
        fprintf(stderr, "wren tokenize: -m DIR is required (the directory of tokenizer.json)\n");
        return -1;
    }
    if (o->text && o->n_files) {
        fprintf(stderr, "wren tokenize: give TEXT or --text-file, not both\n");
        return -1;
    }
    return 0;
}

static void print_ids(const int32_t *ids, int n) {
    char buf[1 << 16];
    size_t k = 0;
    buf[k++] = '[';
    for (int i = 0; i < n; i++) {
        if (k > sizeof buf - 16) {
            fwrite(buf, 1, k, stdout);
            k = 0;
        }
        k += (size_t)snprintf(buf + k, 16, i ? ",%d" : "%d", ids[i]);
    }
    buf[k++] = ']';
    buf[k++] = '\n';
    fwrite(buf, 1, k, stdout);
}

static int encode_print(const struct tokenizer *t, const char *text, size_t len, const char *what) {
    struct wren_err e = {0};
    int32_t *ids;
    int n = tokenizer_encode(t, text, len, &ids, &e);
    if (n < 0) {
        fprintf(stderr, "wren tokenize: %s: %s\n", what, e.msg);
        return -1;
    }
    print_ids(ids, n);
    free(ids);
    return 0;
}

static double cpu_sec(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

// Load time, then encoding speed: the first pass starts with an empty word cache, later passes
// (repeated for about a second) find most words cached, as a long-running server would. Both
// wall-clock and this thread's CPU time are shown: on a busy machine the wall clock also counts
// time spent waiting for a core.
static int bench(const char *model, const char *text, size_t len) {
    struct wren_err e = {0};
    double w0 = now_sec(), c0 = cpu_sec();
    struct tokenizer *t = tokenizer_load(model, &e);
    double w_load = now_sec() - w0, c_load = cpu_sec() - c0;
    if (!t) {
        fprintf(stderr, "wren tokenize: %s\n", e.msg);
        return 1;
    }
    int32_t *ids;
    w0 = now_sec(), c0 = cpu_sec();
    int n = tokenizer_encode(t, text, len, &ids, &e);
    double w_cold = now_sec() - w0, c_cold = cpu_sec() - c0;
    if (n < 0) {
        fprintf(stderr, "wren tokenize: %s\n", e.msg);
        tokenizer_free(t);
        return 1;
    }
    free(ids);
    double w_best = 1e30, c_best = 1e30, total = 0;
    int reps = 0;
    while (total < 1.0 && reps < 1000) {
        w0 = now_sec(), c0 = cpu_sec();
        tokenizer_encode(t, text, len, &ids, &e);
        double dw = now_sec() - w0, dc = cpu_sec() - c0;
        free(ids);
        total += dw, reps++;
        if (dw < w_best) w_best = dw;
        if (dc < c_best) c_best = dc;
    }
    double mb = (double)len / 1e6;
    printf("load: %.1f ms wall, %.1f ms CPU\n", w_load * 1e3, c_load * 1e3);
    printf("encode: %.2f MB -> %d tokens (%.2f bytes/token)\n", mb, n, (double)len / (n ? n : 1));
    printf("  first pass (empty word cache): %.1f MB/s wall, %.1f MB/s CPU\n", mb / w_cold,
           mb / c_cold);
    printf("  best of %d passes (warm cache): %.1f MB/s wall, %.1f MB/s CPU\n", reps, mb / w_best,
           mb / c_best);
    tokenizer_free(t);
    return 0;
}

int cmd_tokenize(int argc, char **argv) {
    struct tokenize_opts o = {0};
    if (parse(&o, argc, argv)) {
        usage(stderr);
        return 2;
    }
    struct wren_err e = {0};
    if (o.bench) {
        size_t len;
        char *text =
            o.text ? xstrdup(o.text) : read_file(o.n_files ? o.files[0] : "/dev/stdin", &len, &e);
        if (!text) {
            fprintf(stderr, "wren tokenize: %s\n", e.msg);
            return 1;
        }
        if (o.text) len = strlen(text);
        int rc = bench(o.model, text, len);
        free(text);
        return rc;
    }
    struct tokenizer *t = tokenizer_load(o.model, &e);
    if (!t) {
        fprintf(stderr, "wren tokenize: %s\n", e.msg);
        return 1;
    }
    int rc = 0;
    if (o.text) {
        rc = encode_print(t, o.text, strlen(o.text), "TEXT");
    } else if (!o.n_files) {
        size_t len;
        char *text = read_file("/dev/stdin", &len, &e);
        rc = text ? encode_print(t, text, len, "stdin")
                  : (fprintf(stderr, "wren tokenize: %s\n", e.msg), -1);
        free(text);
    }
    for (int i = 0; i < o.n_files && !rc; i++) {
        size_t len;
        char *text = read_file(o.files[i], &len, &e);
        if (!text) {
            fprintf(stderr, "wren tokenize: %s\n", e.msg);
            rc = -1;
            break;
        }
        rc = encode_print(t, text, len, o.files[i]);
        free(text);
    }
    tokenizer_free(t);
    if (fflush(stdout)) rc = -1;
    return rc ? 1 : 0;
}
