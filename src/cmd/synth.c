// wren synth: writes a random-weight checkpoint with the real layout and shapes (src/synth/).
#include <dirent.h>
#include <errno.h>
#include <fnmatch.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cmd/cmd.h"
#include "synth/synth.h"
#include "util/util.h"

struct synth_opts {
    const char *preset, *out, *tokenizer;
    int layers; // 0: the preset's
    uint64_t seed;
    int threads;  // 0: all cores
    int shard_mb; // shard size cap in MiB
    int vision;   // -1: the preset's choice
    bool force;
    bool plan; // print the tensor table instead of writing
};

static void usage(FILE *f) {
    fprintf(
        f,
        "usage: wren synth --preset tiny|qwen3.6-35b-a3b --out DIR [options]\n"
        "Writes a random-weight checkpoint in the MLX affine 4-bit layout (group 64; router and\n"
        "shared-expert gate 8-bit) with the tensor names, dtypes, shapes, sharding and\n"
        "config.json of mlx-community/Qwen3.6-35B-A3B-4bit.\n\n"
        "  --preset NAME        qwen3.6-35b-a3b (the real dimensions, ~20 GB) or tiny\n"
        "  --out DIR            output directory (created; must be empty unless --force)\n"
        "  --tokenizer DIR      copy tokenizer.json, tokenizer_config.json (and\n"
        "                       chat_template.jinja, generation_config.json if present) and\n"
        "                       size the vocabulary to cover it (max id + 1, rounded up to 64;\n"
        "                       never below the real preset's 248320)\n"
        "  --layers N           number of layers (full attention every 4th)\n"
        "  --seed S             random seed (default 0); same seed, same bytes\n"
        "  --threads N          generator threads (default: all cores)\n"
        "  --vision/--no-vision write the vision tower's tensors (default: only for\n"
        "                       qwen3.6-35b-a3b, as published)\n"
        "  --shard-mb N         start a new file past N MiB (default 5120, as mlx-lm)\n"
        "  --force              write into a non-empty DIR (replacing model*.safetensors)\n"
        "  --plan               print the tensor table and config.json (JSON), write nothing\n");
}

static int opt_u64(const char *name, const char *v, uint64_t *out) {
    char *end;
    errno = 0;
    unsigned long long x = strtoull(v, &end, 10);
    if (errno || end == v || *end || *v == '-') {
        fprintf(stderr, "wren: %s: expected a non-negative integer, got '%s'\n", name, v);
        return -1;
    }
    *out = x;
    return 0;
}

static int parse(struct synth_opts *o, int argc, char **argv) {
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
#define VALUE()  (v = opt_value(argc, argv, &i))
#define IS(name) (!strcmp(a, name) || (!strncmp(a, name "=", sizeof name) && a[1] == '-'))
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            exit(0);
        } else if (IS("--preset")) {
            if (!VALUE()) return -1;
            o->preset = v;
        } else if (IS("--out")) {
            if (!VALUE()) return -1;
            o->out = v;
        } else if (IS("--tokenizer")) {
            if (!VALUE()) return -1;
            o->tokenizer = v;
        } else if (IS("--layers")) {
            if (!VALUE() || opt_int("--layers", v, 1, SYNTH_MAX_LAYERS, &o->layers)) return -1;
        } else if (IS("--seed")) {
            if (!VALUE() || opt_u64("--seed", v, &o->seed)) return -1;
        } else if (IS("--threads")) {
            if (!VALUE() || opt_int("--threads", v, 1, 256, &o->threads)) return -1;
        } else if (IS("--shard-mb")) {
            if (!VALUE() || opt_int("--shard-mb", v, 1, 1 << 20, &o->shard_mb)) return -1;
        } else if (!strcmp(a, "--vision")) {
            o->vision = 1;
        } else if (!strcmp(a, "--no-vision")) {
            o->vision = 0;
        } else if (!strcmp(a, "--force")) {
            o->force = true;
        } else if (!strcmp(a, "--plan")) {
            o->plan = true;
        } else {
            fprintf(stderr, "wren synth: unknown option '%s'\n", a);
            usage(stderr);
            return -1;
        }
#undef VALUE
#undef IS
    }
    if (!o->preset || (!o->out && !o->plan)) {
        fprintf(stderr, "wren synth: --preset and --out are required\n");
        usage(stderr);
        return -1;
    }
    return 0;
}

static int mkdir_p(const char *dir, struct wren_err *e) {
    char *p = xstrdup(dir);
    for (char *s = p + 1;; s++) {
        if (*s == '/' || !*s) {
            char c = *s;
            *s = 0;
            if (mkdir(p, 0755) && errno != EEXIST) {
                int err = errno;
                wren_errf(e, "cannot create directory %s: %s", p, strerror(err));
                free(p);
                return -1;
            }
            *s = c;
            if (!c) break;
        }
    }
    free(p);
    return 0;
}

static bool is_checkpoint_file(const char *name) {
    return !fnmatch("model*.safetensors", name, 0) || !strcmp(name, "model.safetensors.index.json");
}

// The output directory must be new or empty; with --force, earlier shards are removed so that
// no stale file of another sharding is left beside the new index.
static int prepare_dir(const char *dir, bool force, struct wren_err *e) {
    struct stat st;
    if (!*dir) return wren_errf(e, "--out: empty directory name");
    if (stat(dir, &st)) {
        if (errno != ENOENT) return wren_errf(e, "%s: %s", dir, strerror(errno));
        return mkdir_p(dir, e);
    }
    if (!S_ISDIR(st.st_mode)) return wren_errf(e, "%s exists and is not a directory", dir);
    DIR *d = opendir(dir);
    if (!d) return wren_errf(e, "cannot open %s: %s", dir, strerror(errno));
    int rc = 0;
    struct dirent *de;
    while (!rc && (de = readdir(d))) {
        if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, "..")) continue;
        if (!force) {
            rc = wren_errf(e, "%s is not empty (pass --force to write into it anyway)", dir);
        } else if (is_checkpoint_file(de->d_name)) {
            char path[4096];
            snprintf(path, sizeof path, "%s/%s", dir, de->d_name);
            if (unlink(path)) rc = wren_errf(e, "cannot remove %s: %s", path, strerror(errno));
        }
    }
    closedir(d);
    if (!rc && access(dir, W_OK)) rc = wren_errf(e, "%s is not writable: %s", dir, strerror(errno));
    return rc;
}

static void apply_tokenizer(struct synth_dims *d, const struct synth_tokenizer *tk) {
    int covered = (tk->n_ids + 63) / 64 * 64;
    if (!strcmp(d->preset, "tiny") || covered > d->vocab) d->vocab = covered;
    d->endoftext = tk->endoftext;
    d->im_end = tk->im_end;
    d->vision_start = tk->vision_start;
    d->vision_end = tk->vision_end;
    d->image_pad = tk->image_pad;
    d->video_pad = tk->video_pad;
}

static int run(const struct synth_opts *o, struct wren_err *e) {
    struct synth_dims d;
    if (synth_preset(o->preset, &d, e)) return -1;
    if (o->layers) d.n_layers = o->layers;
    if (o->vision >= 0) d.vision = o->vision;
    struct synth_tokenizer tk;
    if (o->tokenizer) {
        if (synth_tokenizer_read(o->tokenizer, &tk, e)) return -1;
        apply_tokenizer(&d, &tk);
    }
    if (o->plan) {
        struct synth_plan p;
        synth_plan_build(&p, &d, o->seed, (uint64_t)o->shard_mb << 20);
        int rc = synth_print_plan(&p, &d, stdout, e);
        synth_plan_free(&p);
        return rc;
    }
    if (prepare_dir(o->out, o->force, e)) return -1;
    if (o->tokenizer && synth_tokenizer_copy(o->tokenizer, o->out, &tk, e)) return -1;
    if (synth_write_config(&d, o->out, e)) return -1;
    if (!(o->tokenizer && tk.has_generation_config) && synth_write_generation_config(&d, o->out, e))
        return -1;

    struct synth_plan p;
    synth_plan_build(&p, &d, o->seed, (uint64_t)o->shard_mb << 20);
    int threads = o->threads ? o->threads : (int)sysconf(_SC_NPROCESSORS_ONLN);
    fprintf(stderr, "wren synth: %s, %d layers, vocab %d: %d tensors, %.2f GB in %d file%s\n",
            d.preset, d.n_layers, d.vocab, p.n, p.total_bytes / 1e9, p.n_shards,
            p.n_shards == 1 ? "" : "s");
    double t0 = now_sec();
    int rc = synth_write_shards(&p, o->out, threads, progress_enabled(), e);
    double dt = now_sec() - t0;
    if (!rc) rc = synth_write_index(&p, o->out, e);
    if (!rc)
        fprintf(stderr, "wren synth: wrote %.2f GB in %.1f s (%.2f GB/s, %d threads) to %s\n",
                p.total_bytes / 1e9, dt, dt > 0 ? p.total_bytes / 1e9 / dt : 0.0, threads, o->out);
    synth_plan_free(&p);
    return rc;
}

int cmd_synth(int argc, char **argv) {
    struct synth_opts o = {.shard_mb = 5120, .vision = -1};
    if (parse(&o, argc, argv)) return 2;
    struct wren_err e = {{0}};
    if (run(&o, &e)) {
        fprintf(stderr, "wren synth: %s\n", e.msg);
        return 1;
    }
    return 0;
}
