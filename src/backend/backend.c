// Backend selection: the only place that knows which backends were compiled in.
#include <string.h>

#include "backend/backend.h"

#ifndef WREN_HAVE_CUDA
struct backend *cuda_backend_create(const struct model *m, const struct backend_opts *o,
                                    struct wren_err *e) {
    (void)m;
    (void)o;
    wren_errf(e, "this wren was built without the CUDA backend (nvcc was not found at build time)");
    return NULL;
}
int cuda_device_count(void) {
    return 0;
}
#endif

bool backend_cuda_available(void) {
    return cuda_device_count() > 0;
}

struct backend *backend_create(const struct model *m, const struct backend_opts *o,
                               struct wren_err *e) {
    const char *name = o->name ? o->name : "auto";
    if (!strcmp(name, "auto")) name = backend_cuda_available() ? "cuda" : "cpu";
    if (!strcmp(name, "cpu")) return cpu_backend_create(m, o, e);
    if (!strcmp(name, "cuda")) return cuda_backend_create(m, o, e);
    wren_errf(e, "unknown backend '%s' (expected cpu, cuda or auto)", name);
    return NULL;
}
