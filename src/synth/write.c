// Writes the shards: headers first, then the data in fixed-size chunks that worker threads
// generate and write at their final offsets (in file order, so the disk sees nearly sequential
// writes). Space is reserved up front so a full disk fails before hours of work, every write is
// checked, data is flushed before success is reported, and a failed run removes its partial files.
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>

#include "synth/synth.h"
#include "util/util.h"

struct item {
    int tensor;
    size_t chunk;
};

struct job {
    const struct synth_plan *p;
    const size_t *offset; // absolute file offset of each tensor's data
    int *fd;
    char **path;
    struct item *items;
    size_t n_items;
    atomic_size_t next;
    atomic_size_t bytes_done;
    atomic_int failed;
    pthread_mutex_t err_lock;
    struct wren_err err;
};

static void *worker(void *arg) {
    struct job *j = arg;
    uint8_t *buf = xaligned(SYNTH_CHUNK_BYTES);
    for (;;) {
        if (atomic_load(&j->failed)) break;
        size_t k = atomic_fetch_add(&j->next, 1);
        if (k >= j->n_items) break;
        const struct synth_tensor *t = &j->p->t[j->items[k].tensor];
        size_t start = j->items[k].chunk * SYNTH_CHUNK_BYTES;
        size_t n =
            t->st.nbytes - start < SYNTH_CHUNK_BYTES ? t->st.nbytes - start : SYNTH_CHUNK_BYTES;
        synth_fill(t, j->items[k].chunk, buf, n);
        struct wren_err e;
        if (st_pwrite_all(j->fd[t->shard], buf, n, (off_t)(j->offset[j->items[k].tensor] + start),
                          j->path[t->shard], &e)) {
            pthread_mutex_lock(&j->err_lock);
            if (!atomic_load(&j->failed)) j->err = e;
            atomic_store(&j->failed, 1);
            pthread_mutex_unlock(&j->err_lock);
            break;
        }
        atomic_fetch_add(&j->bytes_done, n);
    }
    free(buf);
    return NULL;
}

static int check_free_space(const char *dir, uint64_t need, struct wren_err *e) {
    struct statvfs s;
    if (statvfs(dir, &s)) return 0; // unknown: the writes themselves will tell
    uint64_t avail = (uint64_t)s.f_bavail * s.f_frsize;
    if (avail < need)
        return wren_errf(e,
                         "not enough disk space in %s: the checkpoint needs %.2f GB, %.2f GB free",
                         dir, need / 1e9, avail / 1e9);
    return 0;
}

// Creates one shard file, reserves its size and writes its header; fills the data offsets.
static int open_shard(const struct synth_plan *p, int s, const char *path, size_t *offset, int *fd,
                      struct wren_err *e) {
    int i0 = 0;
    while (p->t[i0].shard != s) i0++;
    int i1 = i0;
    while (i1 < p->n && p->t[i1].shard == s) i1++;
    struct st_tensor_out *st = xmalloc(sizeof *st * (size_t)(i1 - i0));
    for (int i = i0; i < i1; i++) st[i - i0] = p->t[i].st;
    size_t hlen, data;
    char *hdr = st_header_build(st, i1 - i0, &hlen, &data, e);
    if (!hdr) {
        free(st);
        return -1;
    }
    for (int i = i0; i < i1; i++) offset[i] = st[i - i0].offset;
    free(st);
    *fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (*fd < 0) {
        free(hdr);
        return wren_errf(e, "cannot create %s: %s", path, strerror(errno));
    }
    // Reserving the space makes a full disk fail now; a file system without fallocate just
    // skips the reservation (every write is still checked).
    if (fallocate(*fd, 0, 0, (off_t)(hlen + data)) && errno != EOPNOTSUPP && errno != ENOSYS) {
        int err = errno;
        free(hdr);
        return wren_errf(e, "cannot reserve %.2f GB for %s: %s", (hlen + data) / 1e9, path,
                         strerror(err));
    }
    int rc = st_pwrite_all(*fd, hdr, hlen, 0, path, e);
    free(hdr);
    return rc;
}

int synth_write_shards(const struct synth_plan *p, const char *dir, int threads, bool show_progress,
                       struct wren_err *e) {
    if (check_free_space(dir, p->total_bytes, e)) return -1;
    int ns = p->n_shards;
    int *fd = xmalloc(sizeof(int) * (size_t)ns);
    bool *created = xcalloc((size_t)ns, sizeof(bool));
    char **path = xcalloc((size_t)ns, sizeof(char *));
    size_t *offset = xcalloc((size_t)p->n, sizeof(size_t));
    for (int s = 0; s < ns; s++) fd[s] = -1;
    int rc = 0, opened = 0;
    for (int s = 0; s < ns && !rc; s++) {
        char name[64];
        synth_shard_name(p, s, name, sizeof name);
        path[s] = xmalloc(strlen(dir) + strlen(name) + 2);
        sprintf(path[s], "%s/%s", dir, name);
        rc = open_shard(p, s, path[s], offset, &fd[s], e);
        created[s] = fd[s] >= 0;
        opened = s + 1;
    }

    struct job j = {.p = p, .offset = offset, .fd = fd, .path = path};
    if (!rc) {
        for (int i = 0; i < p->n; i++)
            j.n_items += (p->t[i].st.nbytes + SYNTH_CHUNK_BYTES - 1) / SYNTH_CHUNK_BYTES;
        j.items = xmalloc(sizeof *j.items * (j.n_items ? j.n_items : 1));
        size_t k = 0;
        for (int i = 0; i < p->n; i++)
            for (size_t c = 0; c * SYNTH_CHUNK_BYTES < p->t[i].st.nbytes; c++)
                j.items[k++] = (struct item){i, c};
        atomic_init(&j.next, 0);
        atomic_init(&j.bytes_done, 0);
        atomic_init(&j.failed, 0);
        pthread_mutex_init(&j.err_lock, NULL);
        if (threads < 1) threads = 1;
        if ((size_t)threads > j.n_items) threads = j.n_items ? (int)j.n_items : 1;
        pthread_t *tid = xmalloc(sizeof(pthread_t) * (size_t)threads);
        int started = 0;
        for (; started < threads; started++)
            if (pthread_create(&tid[started], NULL, worker, &j)) break;
        if (!started) worker(&j); // no thread could start: do the work here
        while (started && atomic_load(&j.next) < j.n_items && !atomic_load(&j.failed)) {
            if (show_progress)
                progress("synth: MB written", atomic_load(&j.bytes_done) >> 20,
                         p->total_bytes >> 20);
            struct timespec ts = {0, 200 * 1000 * 1000};
            nanosleep(&ts, NULL);
        }
        for (int t = 0; t < started; t++) pthread_join(tid[t], NULL);
        free(tid);
        pthread_mutex_destroy(&j.err_lock);
        if (atomic_load(&j.failed)) {
            *e = j.err;
            rc = -1;
        } else if (show_progress) {
            progress("synth: MB written", p->total_bytes >> 20, p->total_bytes >> 20);
        }
        free(j.items);
    }
    // Flush so that success means the data is on disk (late write errors surface here too).
    for (int s = 0; s < opened; s++) {
        if (fd[s] < 0) continue;
        if (!rc && fdatasync(fd[s])) rc = wren_errf(e, "writing %s: %s", path[s], strerror(errno));
        if (close(fd[s]) && !rc) rc = wren_errf(e, "closing %s: %s", path[s], strerror(errno));
    }
    if (rc)
        for (int s = 0; s < opened; s++)
            if (created[s]) unlink(path[s]);
    for (int s = 0; s < ns; s++) free(path[s]);
    free(path);
    free(fd);
    free(created);
    free(offset);
    return rc;
}
