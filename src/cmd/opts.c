#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "cmd/cmd.h"
#include "util/util.h"

// "--name=value" or "--name value"
const char *opt_value(int argc, char **argv, int *i) {
    const char *eq = strchr(argv[*i], '=');
    if (eq && argv[*i][0] == '-' && argv[*i][1] == '-') return eq + 1;
    if (*i + 1 >= argc) {
        fprintf(stderr, "wren: option %s needs a value\n", argv[*i]);
        return NULL;
    }
    return argv[++*i];
}

static int opt_is(const char *arg, const char *name) {
    size_t n = strlen(name);
    return !strncmp(arg, name, n) && (arg[n] == 0 || (arg[n] == '=' && name[1] == '-'));
}

int opt_int(const char *name, const char *v, long lo, long hi, int *out) {
    char *end;
    errno = 0;
    long x = strtol(v, &end, 10);
    if (errno || end == v || *end || x < lo || x > hi) {
        fprintf(stderr, "wren: %s: expected an integer in [%ld, %ld], got '%s'\n", name, lo, hi, v);
        return -1;
    }
    *out = (int)x;
    return 0;
}

int opt_float(const char *name, const char *v, float *out) {
    char *end;
    errno = 0;
    float x = strtof(v, &end);
    if (errno || end == v || *end || !isfinite(x)) {
        fprintf(stderr, "wren: %s: expected a number, got '%s'\n", name, v);
        return -1;
    }
    *out = x;
    return 0;
}

int opt_float_in(const char *name, const char *v, float lo, float hi, float *out) {
    float x;
    if (opt_float(name, v, &x)) return -1;
    if (x < lo || x > hi) {
        fprintf(stderr, "wren: %s: expected a number in [%g, %g], got '%s'\n", name, lo, hi, v);
        return -1;
    }
    *out = x;
    return 0;
}

int opt_int_list(const char *name, const char *v, int *out, int max) {
    int n = 0;
    const char *p = v;
    while (*p) {
        char *end;
        errno = 0;
        long x = strtol(p, &end, 10);
        if (end == p || errno || x <= 0) goto bad;
        if (*end == 'k' || *end == 'K') x *= 1024, end++;
        if (x > (1L << 24) || n >= max) goto bad;
        out[n++] = (int)x;
        if (*end == ',')
            end++;
        else if (*end)
            goto bad;
        p = end;
    }
    if (n) return n;
bad:
    fprintf(stderr, "wren: %s: expected a list like 256,1K,4096 (at most %d), got '%s'\n", name,
            max, v);
    return -1;
}

int opt_engine(struct wren_engine_opts *o, int argc, char **argv, int *i) {
    const char *a = argv[*i], *v;
    if (!strcmp(a, "-m") || opt_is(a, "--model")) {
        if (!(v = opt_value(argc, argv, i))) return -1;
        o->model_dir = v;
        return 1;
    }
    if (opt_is(a, "--backend")) {
        if (!(v = opt_value(argc, argv, i))) return -1;
        if (strcmp(v, "cpu") && strcmp(v, "cuda") && strcmp(v, "auto")) {
            fprintf(stderr, "wren: --backend: expected cpu, cuda or auto, got '%s'\n", v);
            return -1;
        }
        o->backend = v;
        return 1;
    }
    if (opt_is(a, "--threads")) {
        if (!(v = opt_value(argc, argv, i))) return -1;
        return opt_int("--threads", v, 0, 1024, &o->threads) ? -1 : 1;
    }
    if (opt_is(a, "--prefill-chunk")) {
        if (!(v = opt_value(argc, argv, i))) return -1;
        return opt_int("--prefill-chunk", v, 1, 1 << 20, &o->prefill_chunk) ? -1 : 1;
    }
    if (opt_is(a, "--ctx")) {
        if (!(v = opt_value(argc, argv, i))) return -1;
        return opt_int("--ctx", v, 1, 1 << 24, &o->ctx) ? -1 : 1;
    }
    if (opt_is(a, "--kv-cache")) {
        if (!(v = opt_value(argc, argv, i))) return -1;
        if (strcmp(v, "int8") && strcmp(v, "default")) {
            fprintf(stderr, "wren: --kv-cache: expected default or int8, got '%s'\n", v);
            return -1;
        }
        o->kv_int8 = !strcmp(v, "int8");
        return 1;
    }
    if (opt_is(a, "--device")) {
        if (!(v = opt_value(argc, argv, i))) return -1;
        return opt_int("--device", v, 0, 64, &o->device) ? -1 : 1;
    }
    return 0;
}

int read_tokens_json(const char *path, int **out, struct wren_err *e) {
    size_t len;
    char *text = read_file(path, &len, e);
    if (!text) return -1;
    cJSON *root = cJSON_ParseWithLength(text, len);
    free(text);
    if (!root || !cJSON_IsArray(root)) {
        cJSON_Delete(root);
        return wren_errf(e, "%s: expected a JSON array of token ids", path);
    }
    int n = cJSON_GetArraySize(root), k = 0;
    int *tok = xmalloc(sizeof(int) * (size_t)(n ? n : 1));
    for (cJSON *it = root->child; it; it = it->next) {
        double d = it->valuedouble;
        if (!cJSON_IsNumber(it) || d < 0 || d > 2147483647.0 || d != floor(d)) {
            cJSON_Delete(root);
            free(tok);
            return wren_errf(e, "%s: element %d is not a non-negative integer token id", path, k);
        }
        tok[k++] = (int)d;
    }
    cJSON_Delete(root);
    *out = tok;
    return n;
}
