// User stop strings over streamed text: text passes through as soon as it cannot be the start of
// a stop string; at the first occurrence of one, the text before it is passed on and the stop
// string and everything after it are dropped.
#pragma once
#include <stdbool.h>
#include <stddef.h>

struct stop_strings;
typedef void (*text_sink)(void *ud, const char *text, size_t len);

// Empty strings are ignored. The strings are copied.
struct stop_strings *stop_strings_new(const char *const *stops, int n);
void stop_strings_free(struct stop_strings *s);
// Returns true once a stop string has been found (later pushes are ignored).
bool stop_strings_push(struct stop_strings *s, const char *text, size_t len, text_sink sink,
                       void *ud);
// End of the stream: passes on the text held back as a possible start of a stop string.
void stop_strings_flush(struct stop_strings *s, text_sink sink, void *ud);
