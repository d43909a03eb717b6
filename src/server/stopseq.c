#include <stdlib.h>
#include <string.h>

#include "server/stopseq.h"
#include "util/util.h"

void stopseq_init(struct stopseq *s, const char *const *stop, int n_stop) {
    memset(s, 0, sizeof *s);
    s->stop = stop;
    s->n_stop = n_stop;
    for (int i = 0; i < n_stop; i++)
        if (strlen(stop[i]) > s->max_len) s->max_len = strlen(stop[i]);
}

void stopseq_free(struct stopseq *s) {
    free(s->hold);
    s->hold = NULL;
}

bool stopseq_push(struct stopseq *s, const char *text, size_t len, stopseq_out out, void *ud) {
    if (s->hit) return true;
    if (s->n_stop == 0) {
        if (len) out(ud, text, len);
        return false;
    }
    if (s->len + len + 1 > s->cap) {
        s->cap = (s->len + len + 1) * 2;
        s->hold = xrealloc(s->hold, s->cap);
    }
    memcpy(s->hold + s->len, text, len);
    s->len += len;
    s->hold[s->len] = 0;
    size_t first = s->len;
    for (int i = 0; i < s->n_stop; i++) {
        const char *at = memmem(s->hold, s->len, s->stop[i], strlen(s->stop[i]));
        if (at && (size_t)(at - s->hold) < first) first = (size_t)(at - s->hold);
    }
    if (first < s->len) {
        if (first) out(ud, s->hold, first);
        s->len = 0;
        s->hit = true;
        return true;
    }
    // Keep the last max_len-1 bytes (a stop sequence may be starting there), cut on a
    // character boundary.
    size_t keep = s->max_len - 1, cut = s->len > keep ? s->len - keep : 0;
    while (cut > 0 && ((unsigned char)s->hold[cut] & 0xc0) == 0x80) cut--;
    if (cut) {
        out(ud, s->hold, cut);
        memmove(s->hold, s->hold + cut, s->len - cut);
        s->len -= cut;
    }
    return false;
}

void stopseq_flush(struct stopseq *s, stopseq_out out, void *ud) {
    if (!s->hit && s->len) out(ud, s->hold, s->len);
    s->len = 0;
}
