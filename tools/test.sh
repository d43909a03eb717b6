#!/usr/bin/env bash
# The test command: installs dependencies, builds, runs every test (ctest), then the bad-input
# tests again under AddressSanitizer + UBSan.
set -euo pipefail
cd "$(dirname "$0")/.."
tools/setup.sh
tools/build.sh
(cd build && ctest --output-on-failure -j2)
# Sanitizer build: CPU only (CUDA off keeps it fast); runs the loader/parser robustness tests.
cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Debug -DWREN_SANITIZE=ON -DWREN_CUDA=OFF >/dev/null
cmake --build build-asan -j"$(nproc)"
(cd build-asan && ctest --output-on-failure -j2 -L sanitize)
