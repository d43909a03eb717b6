// CUDA backend entry points (placeholder until the decode/prefill paths land).
#include <cuda_runtime.h>

extern "C" {
#include "backend/backend.h"
}

extern "C" int cuda_device_count(void) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        cudaGetLastError(); // no driver or no device: clear the sticky error, report none
        return 0;
    }
    return n;
}

extern "C" struct backend *cuda_backend_create(const struct model *m, const struct backend_opts *o,
                                               struct wren_err *e) {
    (void)m;
    (void)o;
    wren_errf(e, "the CUDA backend is not implemented yet");
    return NULL;
}
