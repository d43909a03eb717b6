#include "text/utf8.h"

#include <string.h>

// Valid second-byte range for a lead byte (Unicode Table 3-7); the others are 80..BF.
static void second_range(unsigned c, unsigned *lo, unsigned *hi) {
    *lo = 0x80, *hi = 0xBF;
    if (c == 0xE0)
        *lo = 0xA0;
    else if (c == 0xED)
        *hi = 0x9F;
    else if (c == 0xF0)
        *lo = 0x90;
    else if (c == 0xF4)
        *hi = 0x8F;
}

static int seq_len(unsigned c) {
    if (c < 0x80) return 1;
    if (c >= 0xC2 && c <= 0xDF) return 2;
    if (c >= 0xE0 && c <= 0xEF) return 3;
    if (c >= 0xF0 && c <= 0xF4) return 4;
    return 0;
}

int utf8_next(const unsigned char *s, size_t len, uint32_t *cp, int *bad) {
    *bad = 0;
    if (!len) return 0;
    unsigned c = s[0];
    int n = seq_len(c);
    if (n == 1) {
        *cp = c;
        return 1;
    }
    if (n == 0) {
        *bad = 1;
        return 0;
    }
    unsigned lo, hi;
    second_range(c, &lo, &hi);
    for (int k = 1; k < n; k++) {
        if ((size_t)k >= len) return 0; // incomplete: could still be completed
        unsigned b = s[k];
        unsigned l = k == 1 ? lo : 0x80, h = k == 1 ? hi : 0xBF;
        if (b < l || b > h) {
            *bad = k;
            return 0;
        }
    }
    uint32_t v = c & (0x7F >> n);
    for (int k = 1; k < n; k++) v = (v << 6) | (s[k] & 0x3F);
    *cp = v;
    return n;
}

size_t utf8_valid_prefix(const char *str, size_t len) {
    const unsigned char *s = (const unsigned char *)str;
    size_t i = 0;
    while (i < len) {
        // ASCII fast path, 8 bytes at a time.
        while (i + 8 <= len) {
            uint64_t w;
            memcpy(&w, s + i, 8);
            if (w & 0x8080808080808080ull) break;
            i += 8;
        }
        if (i >= len) break;
        if (s[i] < 0x80) {
            i++;
            continue;
        }
        uint32_t cp;
        int bad, n = utf8_next(s + i, len - i, &cp, &bad);
        if (n == 0) return i;
        i += (size_t)n;
    }
    return len;
}

int utf8_put(uint32_t cp, char *out) {
    unsigned char *o = (unsigned char *)out;
    if (cp < 0x80) {
        o[0] = (unsigned char)cp;
        return 1;
    }
    if (cp < 0x800) {
        o[0] = (unsigned char)(0xC0 | (cp >> 6));
        o[1] = (unsigned char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        o[0] = (unsigned char)(0xE0 | (cp >> 12));
        o[1] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
        o[2] = (unsigned char)(0x80 | (cp & 0x3F));
        return 3;
    }
    o[0] = (unsigned char)(0xF0 | (cp >> 18));
    o[1] = (unsigned char)(0x80 | ((cp >> 12) & 0x3F));
    o[2] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
    o[3] = (unsigned char)(0x80 | (cp & 0x3F));
    return 4;
}
