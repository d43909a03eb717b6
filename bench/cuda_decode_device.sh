#!/usr/bin/env bash
# Everything the decode engineer runs in one GPU call, from a folder packed by
#   tools/devpack.sh BUILD /work/main/.devwork/X && cp (synth build's wren) X/wren-synth && cp bench/cuda_*.sh X/
# (optionally tarred as X/pack.txz to stay under the 64 MiB transfer limit):
#   kernel checks, CUDA vs CPU on tiny synthesized models, decode speed on the full-size model.
cd "$(dirname "$0")" || exit 1
[ -f pack.txz ] && tar xJf pack.txz
export LD_LIBRARY_PATH=$PWD/lib
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
echo "== kernel checks"; ./cuda_checks.sh cuda_checks
echo "== cuda vs cpu"; timeout 240 ./cuda_vs_cpu.sh ./wren ./wren-synth cuda_checks /tmp/cvc 2>&1
echo "== decode speed"; timeout "${SPEED_TIMEOUT:-300}" ./cuda_decode.sh ./wren-synth cuda_checks /tmp/m "${CTXS:-256,1024,4096,16384,32768,65536,131072}" 128 2>&1
