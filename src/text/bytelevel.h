// The GPT-2 "ByteLevel" alphabet: every byte is shown as one printable character (space is 'Ġ',
// newline 'Ċ', ...). Vocabulary strings in tokenizer.json are written in it.
#pragma once
#include <stddef.h>
#include <stdint.h>

// Code point that stands for byte b.
uint32_t bytelevel_char(unsigned char b);
// Decodes a ByteLevel string (UTF-8) into raw bytes at out (room for n bytes). Returns the number
// of bytes, or -1 if some character is not in the alphabet (or s is not valid UTF-8).
long bytelevel_decode(const char *s, size_t n, char *out);
