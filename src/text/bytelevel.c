#include "text/bytelevel.h"

#include "text/utf8.h"

// Bytes that are printable Latin-1 keep their code point; the other 68 are numbered from U+0100
// in byte order.
static int printable(unsigned b) {
    return (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
}

uint32_t bytelevel_char(unsigned char b) {
    if (printable(b)) return b;
    // Rank of b among the non-printable bytes.
    unsigned r;
    if (b <= 0x20)
        r = b; // 0x00..0x20: 33 bytes
    else if (b <= 0xA0)
        r = 33 + (b - 0x7F); // 0x7F..0xA0: 34 bytes
    else
        r = 67; // 0xAD
    return 0x100 + r;
}

static int char_byte(uint32_t cp) {
    if (cp < 0x100) return printable(cp) ? (int)cp : -1;
    if (cp < 0x100 + 33) return (int)(cp - 0x100);
    if (cp < 0x100 + 67) return (int)(cp - 0x100 - 33 + 0x7F);
    if (cp == 0x100 + 67) return 0xAD;
    return -1;
}

long bytelevel_decode(const char *s, size_t n, char *out) {
    const unsigned char *u = (const unsigned char *)s;
    size_t i = 0, o = 0;
    while (i < n) {
        uint32_t cp;
        int bad, k = utf8_next(u + i, n - i, &cp, &bad);
        if (k == 0) return -1;
        int b = char_byte(cp);
        if (b < 0) return -1;
        out[o++] = (char)b;
        i += (size_t)k;
    }
    return (long)o;
}
