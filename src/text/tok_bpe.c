// Byte-pair merging of one pre-token: repeatedly merge the adjacent pair with the lowest merge
// rank (the leftmost one on ties) until no pair has a merge. Short words use a plain quadratic
// scan (fast for the usual 1-20 bytes); long ones a heap, so a 100 KB run without spaces stays
// O(n log n).
#include <string.h>

#include "text/tok_internal.h"

#define SHORT_WORD 48
#define NO_RANK    UINT32_MAX

static size_t bpe_short(const struct tokenizer *t, const int32_t *sym0, size_t m, int32_t *out) {
    int32_t sym[SHORT_WORD], nid[SHORT_WORD];
    uint32_t rank[SHORT_WORD];
    memcpy(sym, sym0, m * sizeof *sym);
    for (size_t i = 0; i + 1 < m; i++)
        if (!merge_get(&t->merges, sym[i], sym[i + 1], &rank[i], &nid[i])) rank[i] = NO_RANK;
    while (m > 1) {
        uint32_t best = NO_RANK;
        size_t bi = 0;
        for (size_t i = 0; i + 1 < m; i++)
            if (rank[i] < best) best = rank[i], bi = i;
        if (best == NO_RANK) break;
        sym[bi] = nid[bi];
        size_t tail = m - bi - 2; // symbols after the removed right half
        memmove(sym + bi + 1, sym + bi + 2, tail * sizeof *sym);
        memmove(rank + bi + 1, rank + bi + 2, (tail ? tail - 1 : 0) * sizeof *rank);
        memmove(nid + bi + 1, nid + bi + 2, (tail ? tail - 1 : 0) * sizeof *nid);
        m--;
        if (bi > 0 && !merge_get(&t->merges, sym[bi - 1], sym[bi], &rank[bi - 1], &nid[bi - 1]))
            rank[bi - 1] = NO_RANK;
        if (bi + 1 < m && !merge_get(&t->merges, sym[bi], sym[bi + 1], &rank[bi], &nid[bi]))
            rank[bi] = NO_RANK;
    }
    memcpy(out, sym, m * sizeof *sym);
    return m;
}

// Min-heap of (rank << 32 | position): ties on rank go to the leftmost position.
static void heap_push(uint64_t *h, size_t *n, uint64_t v) {
    size_t i = (*n)++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (h[p] <= v) break;
        h[i] = h[p];
        i = p;
    }
    h[i] = v;
}

static uint64_t heap_pop(uint64_t *h, size_t *n) {
    uint64_t top = h[0], v = h[--*n];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= *n) break;
        if (c + 1 < *n && h[c + 1] < h[c]) c++;
        if (v <= h[c]) break;
        h[i] = h[c];
        i = c;
    }
    h[i] = v;
    return top;
}

static void push_pair(const struct tokenizer *t, uint64_t *h, size_t *nh, const int32_t *sym,
                      uint32_t pos, uint32_t right) {
    uint32_t rank;
    int32_t id;
    if (merge_get(&t->merges, sym[pos], sym[right], &rank, &id))
        heap_push(h, nh, ((uint64_t)rank << 32) | pos);
}

static size_t bpe_long(const struct tokenizer *t, const int32_t *sym0, size_t m, int32_t *out,
                       uint32_t *scratch) {
    int32_t *sym = (int32_t *)scratch;
    uint32_t *prev = scratch + m, *next = scratch + 2 * m;
    uint64_t *heap = (uint64_t *)(void *)(scratch + 3 * m + (m & 1)); // 8-byte aligned
    size_t nh = 0;
    const uint32_t none = UINT32_MAX;
    memcpy(sym, sym0, m * sizeof *sym);
    for (size_t i = 0; i < m; i++) {
        prev[i] = i ? (uint32_t)i - 1 : none;
        next[i] = i + 1 < m ? (uint32_t)i + 1 : none;
    }
    for (size_t i = 0; i + 1 < m; i++) push_pair(t, heap, &nh, sym, (uint32_t)i, (uint32_t)i + 1);
    while (nh) {
        uint64_t top = heap_pop(heap, &nh);
        uint32_t pos = (uint32_t)top, want = (uint32_t)(top >> 32);
        if (sym[pos] < 0 || next[pos] == none) continue; // merged away, or now last
        uint32_t r = next[pos], rank;
        int32_t nid;
        // A stale entry: the pair at pos changed since it was queued.
        if (!merge_get(&t->merges, sym[pos], sym[r], &rank, &nid) || rank != want) continue;
        sym[pos] = nid;
        sym[r] = -1;
        next[pos] = next[r];
        if (next[r] != none) prev[next[r]] = pos;
        if (prev[pos] != none) push_pair(t, heap, &nh, sym, prev[pos], pos);
        if (next[pos] != none) push_pair(t, heap, &nh, sym, pos, next[pos]);
    }
    size_t k = 0;
    for (uint32_t i = 0; i != none; i = next[i]) out[k++] = sym[i];
    return k;
}

size_t tok_bpe(const struct tokenizer *t, const unsigned char *w, size_t n, int32_t *out,
               uint32_t *scratch) {
    if (t->ignore_merges) {
        int32_t id = tok_vocab_find(t, (const char *)w, n);
        if (id >= 0) {
            out[0] = id;
            return 1;
        }
    }
    // Initial symbols: one per byte; a byte missing from the vocabulary is dropped, as the
    // tokenizers library does without an unknown token.
    int32_t *sym = out;
    size_t m = 0;
    for (size_t i = 0; i < n; i++) {
        int32_t id = t->byte_id[w[i]];
        if (id >= 0) sym[m++] = id;
    }
    if (m <= 1) return m;
    if (m <= SHORT_WORD) return bpe_short(t, sym, m, out);
    return bpe_long(t, sym, m, out, scratch);
}
