// Session reuse: a budgeted LRU of engine state snapshots, plus the worker's live session.
//
// DeltaNet state cannot be rewound, so a prompt can resume only at a point where the state was
// saved: the live session's end (when its whole sequence is a prefix of the new prompt) or a
// snapshot whose tokens are a prefix of it. Two kinds of snapshot:
//  - with KV: self-contained, valid forever (taken where a conversation is likely to be resumed
//    after others ran: the start of each new assistant turn, and the live session's end when it
//    is about to be replaced);
//  - without KV (cheap: recurrent state only): valid only while the live session's KV still
//    holds their tokens. Invariant: every cached KV-less snapshot's tokens are a prefix of the
//    live session's computed tokens. Whenever the session is reset or restored to an earlier
//    point, the KV-less snapshots beyond that point are dropped.
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "engine/engine.h"

struct snap_cache;

struct snap_cache *snap_cache_new(size_t budget_bytes);
void snap_cache_free(struct snap_cache *c);

// Brings s to the longest saved prefix of tok[0..n) that leaves at least one token to feed, and
// returns its length (0: reset, nothing reused). -1 on engine error (s is then reset).
int snap_cache_resume(struct snap_cache *c, struct wren_session *s, const int32_t *tok, int n,
                      struct wren_err *e);
// Saves the state of s at its current length. Failures only cost reuse, so they are ignored.
void snap_cache_save(struct snap_cache *c, struct wren_session *s, bool with_kv);
void snap_cache_stats(const struct snap_cache *c, size_t *bytes, int *entries);
