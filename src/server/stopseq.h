// Stop sequences over streamed text: text that could still become a stop sequence is held back;
// what is released never contains one and always ends on a UTF-8 character boundary.
#pragma once
#include <stdbool.h>
#include <stddef.h>

struct stopseq {
    const char *const *stop;
    int n_stop;
    size_t max_len;
    char *hold;
    size_t len, cap;
    bool hit;
};

typedef void (*stopseq_out)(void *ud, const char *text, size_t len);

void stopseq_init(struct stopseq *s, const char *const *stop, int n_stop);
void stopseq_free(struct stopseq *s);
// Adds text; releases what is safe through out. Returns true once a stop sequence matched (the
// text before it has been released, the rest is dropped; further pushes are ignored).
bool stopseq_push(struct stopseq *s, const char *text, size_t len, stopseq_out out, void *ud);
// End of stream: releases everything held.
void stopseq_flush(struct stopseq *s, stopseq_out out, void *ud);
