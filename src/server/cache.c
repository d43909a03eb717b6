#include <stdlib.h>
#include <string.h>

#include "server/cache.h"
#include "util/util.h"

struct entry {
    struct wren_snapshot *snap;
    bool with_kv;
    size_t bytes;
    uint64_t used; // LRU clock
};

struct snap_cache {
    size_t budget, bytes;
    struct entry *e;
    int n, cap;
    uint64_t clock;
};

struct snap_cache *snap_cache_new(size_t budget_bytes) {
    struct snap_cache *c = xcalloc(1, sizeof *c);
    c->budget = budget_bytes;
    return c;
}

static void drop(struct snap_cache *c, int i) {
    c->bytes -= c->e[i].bytes;
    wren_snapshot_free(c->e[i].snap);
    c->e[i] = c->e[--c->n];
}

void snap_cache_free(struct snap_cache *c) {
    if (!c) return;
    while (c->n) drop(c, 0);
    free(c->e);
    free(c);
}

void snap_cache_stats(const struct snap_cache *c, size_t *bytes, int *entries) {
    *bytes = c->bytes;
    *entries = c->n;
}

static bool is_prefix(const int32_t *a, int na, const int32_t *b, int nb) {
    return na <= nb && (na == 0 || !memcmp(a, b, sizeof *a * (size_t)na));
}

// Length of the live session's sequence that is in its state for certain: the last token may
// have been generated but not fed yet.
static int computed_len(struct wren_session *s) {
    int n = wren_session_len(s);
    return n > 0 ? n - 1 : 0;
}

// Drops least recently used entries until the budget holds, never `keep` (the entry about to
// be restored).
static void evict(struct snap_cache *c, const struct wren_snapshot *keep) {
    while (c->bytes > c->budget) {
        int lru = -1;
        for (int i = 0; i < c->n; i++)
            if (c->e[i].snap != keep && (lru < 0 || c->e[i].used < c->e[lru].used)) lru = i;
        if (lru < 0) break;
        drop(c, lru);
    }
}

// A cached snapshot already covering exactly this sequence (no point in saving it twice).
static int find_exact(struct snap_cache *c, const int32_t *tok, int n, bool with_kv) {
    for (int i = 0; i < c->n; i++) {
        const struct entry *x = &c->e[i];
        if (wren_snapshot_len(x->snap) == n && (x->with_kv || !with_kv) &&
            is_prefix(wren_snapshot_tokens(x->snap), n, tok, n))
            return i;
    }
    return -1;
}

static void save(struct snap_cache *c, struct wren_session *s, bool with_kv,
                 const struct wren_snapshot *keep) {
    int n = wren_session_len(s);
    if (c->budget == 0 || n == 0) return;
    int have = find_exact(c, wren_session_tokens(s), n, with_kv);
    if (have >= 0) {
        c->e[have].used = ++c->clock;
        return;
    }
    struct wren_err e;
    struct wren_snapshot *snap = wren_session_snapshot(s, with_kv, &e);
    if (!snap) return;
    size_t bytes = wren_snapshot_bytes(snap);
    if (bytes > c->budget) {
        wren_snapshot_free(snap);
        return;
    }
    if (c->n == c->cap) {
        c->cap = c->cap ? c->cap * 2 : 16;
        c->e = xrealloc(c->e, sizeof *c->e * (size_t)c->cap);
    }
    c->e[c->n++] = (struct entry){snap, with_kv, bytes, ++c->clock};
    c->bytes += bytes;
    evict(c, keep);
}

void snap_cache_save(struct snap_cache *c, struct wren_session *s, bool with_kv) {
    save(c, s, with_kv, NULL);
}

int snap_cache_resume(struct snap_cache *c, struct wren_session *s, const int32_t *tok, int n,
                      struct wren_err *e) {
    int live = wren_session_len(s);
    if (c->budget == 0) {
        wren_session_reset(s);
        return 0;
    }
    // The live session continues as is when its whole sequence starts the prompt.
    if (live > 0 && live < n && is_prefix(wren_session_tokens(s), live, tok, n)) return live;

    int best = -1, best_len = 0, computed = computed_len(s);
    for (int i = 0; i < c->n; i++) {
        const struct entry *x = &c->e[i];
        int len = wren_snapshot_len(x->snap);
        const int32_t *t = wren_snapshot_tokens(x->snap);
        if (len <= best_len || len >= n || !is_prefix(t, len, tok, n)) continue;
        if (!x->with_kv && (len > computed || !is_prefix(t, len, wren_session_tokens(s), live)))
            continue;
        best = i, best_len = len;
    }
    // Before the live session is replaced, keep its end (a conversation that another one
    // interrupts resumes there later) unless a snapshot already holds it.
    const struct wren_snapshot *chosen = best >= 0 ? c->e[best].snap : NULL;
    if (live > 0 && find_exact(c, wren_session_tokens(s), live, true) < 0) save(c, s, true, chosen);
    best = -1; // entries may have moved: find the chosen one again
    for (int i = 0; i < c->n; i++)
        if (c->e[i].snap == chosen) best = i;
    // The session's KV beyond the resume point is about to be overwritten, and before it
    // replaced by the restored snapshot's: KV-less snapshots stay valid only within the prefix
    // that survives.
    int resume = best >= 0 ? best_len : 0;
    for (int i = c->n - 1; i >= 0; i--) {
        const struct entry *x = &c->e[i];
        int len = wren_snapshot_len(x->snap);
        if (!x->with_kv && i != best &&
            (len > resume || !is_prefix(wren_snapshot_tokens(x->snap), len, tok, resume))) {
            drop(c, i);
            if (best == c->n) best = i; // drop() moved the last entry into slot i
        }
    }
    if (best < 0) {
        wren_session_reset(s);
        return 0;
    }
    c->e[best].used = ++c->clock;
    if (wren_session_restore(s, c->e[best].snap, e)) {
        wren_session_reset(s);
        return -1;
    }
    return best_len;
}
