// UTF-8 helpers shared by the tokenizer and the streaming detokenizer. Validation follows the
// Unicode definition exactly (no overlongs, no surrogates, nothing past U+10FFFF), so what passes
// here is what Rust's str and Python's str accept.
#pragma once
#include <stddef.h>
#include <stdint.h>

// Length of the longest valid prefix of s (== len when s is valid UTF-8).
size_t utf8_valid_prefix(const char *s, size_t len);

// Length of the maximal subpart of an ill-formed sequence at s, or of the complete character
// there: returns the number of bytes of a valid character (1..4) and sets *cp, or 0 when s starts
// an ill-formed sequence, with *bad set to the bytes to replace by one U+FFFD (the WHATWG /
// Unicode "maximal subpart" rule, as String::from_utf8_lossy and Python's 'replace' do). When
// the bytes end before a character that could still be completed, returns 0 with *bad = 0.
int utf8_next(const unsigned char *s, size_t len, uint32_t *cp, int *bad);

// Writes cp as UTF-8 (1..4 bytes) and returns the length.
int utf8_put(uint32_t cp, char *out);
