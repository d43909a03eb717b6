#include "text/stop_strings.h"

#include <stdlib.h>
#include <string.h>

#include "util/util.h"

struct stop_strings {
    char **str;
    size_t *len;
    int n;
    char *held; // tail that may still become a stop string (shorter than the longest one)
    size_t n_held, cap;
    bool stopped;
};

struct stop_strings *stop_strings_new(const char *const *stops, int n) {
    struct stop_strings *s = xcalloc(1, sizeof *s);
    s->str = xcalloc((size_t)(n > 0 ? n : 1), sizeof(char *));
    s->len = xcalloc((size_t)(n > 0 ? n : 1), sizeof(size_t));
    for (int i = 0; i < n; i++) {
        if (!stops[i] || !stops[i][0]) continue;
        s->str[s->n] = xstrdup(stops[i]);
        s->len[s->n++] = strlen(stops[i]);
    }
    return s;
}

void stop_strings_free(struct stop_strings *s) {
    if (!s) return;
    for (int i = 0; i < s->n; i++) free(s->str[i]);
    free(s->str);
    free(s->len);
    free(s->held);
    free(s);
}

// Length of the longest suffix of buf[0,n) that is a proper prefix of some stop string.
static size_t partial_tail(const struct stop_strings *s, const char *buf, size_t n) {
    size_t best = 0;
    for (int i = 0; i < s->n; i++) {
        size_t k = s->len[i] - 1 < n ? s->len[i] - 1 : n;
        for (; k > best; k--)
            if (!memcmp(buf + n - k, s->str[i], k)) {
                best = k;
                break;
            }
    }
    return best;
}

bool stop_strings_push(struct stop_strings *s, const char *text, size_t len, text_sink sink,
                       void *ud) {
    if (s->stopped) return true;
    if (s->n == 0) {
        if (len) sink(ud, text, len);
        return false;
    }
    if (s->n_held + len + 1 > s->cap) {
        s->cap = 2 * (s->n_held + len + 1);
        s->held = xrealloc(s->held, s->cap);
    }
    memcpy(s->held + s->n_held, text, len);
    size_t n = s->n_held + len;
    s->n_held = 0;
    // Earliest occurrence of any stop string. Everything before the held tail was already
    // checked, so a match can only involve the held bytes and the new text.
    const char *first = NULL;
    for (int i = 0; i < s->n; i++) {
        const char *m = memmem(s->held, n, s->str[i], s->len[i]);
        if (m && (!first || m < first)) first = m;
    }
    if (first) {
        s->stopped = true;
        if (first > s->held) sink(ud, s->held, (size_t)(first - s->held));
        return true;
    }
    size_t keep = partial_tail(s, s->held, n);
    if (n > keep) sink(ud, s->held, n - keep);
    memmove(s->held, s->held + n - keep, keep);
    s->n_held = keep;
    return false;
}

void stop_strings_flush(struct stop_strings *s, text_sink sink, void *ud) {
    if (!s->stopped && s->n_held) sink(ud, s->held, s->n_held);
    s->n_held = 0;
}
