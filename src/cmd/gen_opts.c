// Options of `wren run` and `wren chat`, parsed once into struct gen_opts.
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cmd/cmd.h"
#include "cmd/gen_common.h"

void gen_opts_init(struct gen_opts *o) {
    memset(o, 0, sizeof *o);
    o->sampling = sampler_defaults();
}

// "--name" or "--name=value"
static bool is(const char *arg, const char *name) {
    size_t n = strlen(name);
    return !strncmp(arg, name, n) && (arg[n] == 0 || arg[n] == '=');
}

static int parse_seed(const char *v, uint64_t *out) {
    char *end;
    errno = 0;
    unsigned long long x = strtoull(v, &end, 10);
    if (errno || end == v || *end || v[0] == '-') {
        fprintf(stderr, "wren: --seed: expected a non-negative integer, got '%s'\n", v);
        return -1;
    }
    *out = (uint64_t)x;
    return 0;
}

int gen_opt(struct gen_opts *o, int argc, char **argv, int *i) {
    int r = opt_engine(&o->engine, argc, argv, i);
    if (r) return r;
    const char *a = argv[*i], *v;
    struct sampler_params *p = &o->sampling;
    if (!strcmp(a, "--no-think")) {
        o->no_think = true;
        return 1;
    }
    // Every option below takes a value.
    static const char *const with_value[] = {"--system",
                                             "--max-tokens",
                                             "--temp",
                                             "--temperature",
                                             "--top-k",
                                             "--top-p",
                                             "--min-p",
                                             "--presence-penalty",
                                             "--frequency-penalty",
                                             "--repetition-penalty",
                                             "--seed",
                                             "--stop",
                                             "--log"};
    const char *name = NULL;
    for (size_t k = 0; k < sizeof with_value / sizeof with_value[0]; k++)
        if (is(a, with_value[k])) name = with_value[k];
    if (!name) return 0;
    if (!(v = opt_value(argc, argv, i))) return -1;
    int bad = 0;
    if (!strcmp(name, "--system"))
        o->system = v;
    else if (!strcmp(name, "--max-tokens"))
        bad = opt_int(name, v, 1, 1 << 30, &o->max_tokens);
    else if (!strcmp(name, "--temp") || !strcmp(name, "--temperature"))
        bad = opt_float_in(name, v, 0, 100, &p->temperature), o->set |= SAMPLER_SET_TEMPERATURE;
    else if (!strcmp(name, "--top-k"))
        bad = opt_int(name, v, 0, 1 << 30, &p->top_k), o->set |= SAMPLER_SET_TOP_K;
    else if (!strcmp(name, "--top-p")) {
        bad = opt_float_in(name, v, 0, 1, &p->top_p), o->set |= SAMPLER_SET_TOP_P;
        if (!bad && p->top_p <= 0) {
            fprintf(stderr, "wren: --top-p: expected a number in (0, 1], got '%s'\n", v);
            bad = -1;
        }
    } else if (!strcmp(name, "--min-p"))
        bad = opt_float_in(name, v, 0, 1, &p->min_p), o->set |= SAMPLER_SET_MIN_P;
    else if (!strcmp(name, "--presence-penalty"))
        bad = opt_float_in(name, v, -2, 2, &p->presence_penalty), o->set |= SAMPLER_SET_PRESENCE;
    else if (!strcmp(name, "--frequency-penalty"))
        bad = opt_float_in(name, v, -2, 2, &p->frequency_penalty), o->set |= SAMPLER_SET_FREQUENCY;
    else if (!strcmp(name, "--repetition-penalty")) {
        bad = opt_float_in(name, v, 0, 100, &p->repetition_penalty),
        o->set |= SAMPLER_SET_REPETITION;
        if (!bad && p->repetition_penalty <= 0) {
            fprintf(stderr, "wren: --repetition-penalty: expected a positive number\n");
            bad = -1;
        }
    } else if (!strcmp(name, "--seed"))
        bad = parse_seed(v, &p->seed), o->set |= SAMPLER_SET_SEED;
    else if (!strcmp(name, "--stop")) {
        if (o->n_stop == GEN_MAX_STOPS) {
            fprintf(stderr, "wren: --stop: at most %d stop strings\n", GEN_MAX_STOPS);
            return -1;
        }
        if (!v[0]) {
            fprintf(stderr, "wren: --stop: the stop string is empty\n");
            return -1;
        }
        o->stop[o->n_stop++] = v;
    } else if (!strcmp(name, "--log"))
        o->log_path = v;
    return bad ? -1 : 1;
}
