#pragma once
#include "util/err.h"

struct server;
struct MHD_Daemon;

// Starts listening (threads of its own); NULL with e filled when the address cannot be bound.
struct MHD_Daemon *http_start(struct server *sv, struct wren_err *e);
int http_port(struct MHD_Daemon *d); // the bound port (useful with --port 0)
// Waits up to `seconds` for every request under way to have its response sent (at shutdown,
// before the daemon closes the connections).
void http_drain(struct server *sv, double seconds);
