// Error reporting: every fallible function returns 0 on success or -1 after filling a wren_err
// with a message a user can act on (file, tensor, expected vs found). No asserts on user input.
#pragma once
#include <stdarg.h>

struct wren_err {
    char msg[1024];
};

// Formats the message into e (if non-NULL) and returns -1, so callers can `return wren_errf(...)`.
int wren_errf(struct wren_err *e, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
// Prepends context ("loading X: ") to an existing message; returns -1.
int wren_err_prefix(struct wren_err *e, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
