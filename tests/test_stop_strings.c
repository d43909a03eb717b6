// Stop strings over streamed text, for every way of cutting the stream into two or three pieces:
// the output is the text before the first occurrence of any stop string, whatever the cuts.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "text/stop_strings.h"

static int failures;

struct buf {
    char s[256];
    size_t n;
};
static void sink(void *ud, const char *t, size_t len) {
    struct buf *b = ud;
    memcpy(b->s + b->n, t, len);
    b->n += len;
    b->s[b->n] = 0;
}

// Reference: cut the whole text at the earliest match.
static void expected(const char *text, const char *const *stops, int n, char *out, int *hit) {
    size_t cut = strlen(text);
    *hit = 0;
    for (int i = 0; i < n; i++) {
        if (!stops[i][0]) continue;
        const char *m = strstr(text, stops[i]);
        if (m && (size_t)(m - text) < cut) cut = (size_t)(m - text);
        if (m) *hit = 1;
    }
    memcpy(out, text, cut);
    out[cut] = 0;
}

static void check(const char *text, const char *const *stops, int n) {
    char want[256];
    int hit;
    expected(text, stops, n, want, &hit);
    size_t len = strlen(text);
    for (size_t a = 0; a <= len; a++)
        for (size_t b = a; b <= len; b++) {
            struct stop_strings *s = stop_strings_new(stops, n);
            struct buf out = {{0}, 0};
            bool st = stop_strings_push(s, text, a, sink, &out);
            st = stop_strings_push(s, text + a, b - a, sink, &out) || st;
            st = stop_strings_push(s, text + b, len - b, sink, &out) || st;
            stop_strings_flush(s, sink, &out);
            stop_strings_free(s);
            if (strcmp(out.s, want) || st != hit) {
                failures++;
                fprintf(stderr, "FAIL '%s' cuts %zu,%zu: got '%s' (stop %d), want '%s' (%d)\n",
                        text, a, b, out.s, st, want, hit);
                return;
            }
        }
}

int main(void) {
    const char *s1[] = {"END"};
    check("hello END world", s1, 1);
    check("hello EN world", s1, 1);
    check("hello world EN", s1, 1);
    check("ENEND", s1, 1);
    check("EEEND", s1, 1);
    const char *s2[] = {"\n\n", "stop here", "ab"};
    check("one\ntwo\n\nthree", s2, 3);
    check("we stop herb and stop here", s2, 3);
    check("xxa", s2, 3);
    check("xab", s2, 3);
    const char *s3[] = {"", "é!"}; // empty strings are ignored; multibyte stops
    check("café! ok", s3, 2);
    check("café", s3, 2);
    const char *s4[] = {"aaa", "aab"};
    check("aaaab", s4, 2);
    check("aab", s4, 2);
    check("nothing", NULL, 0);
    if (failures) return 1;
    printf("stop strings: all checks passed\n");
    return 0;
}
