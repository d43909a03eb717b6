#!/usr/bin/env bash
# Decode-focused GPU run, in one device call, from a folder packed by tools/devpack.sh inside the
# repository (REPO, default ../..):
#   1. the decode kernel checks (bench/cuda_checks.sh) and the CUDA-vs-CPU end-to-end check;
#   2. bench_decode_gemv: each decode GEMV kind on the real shapes, int8+PDL / int8 / f32 kernels;
#   3. wren bench --backend cuda decode on the full-size synthesized Qwen3.6-35B-A3B, with the
#      default kernels, without PDL, and with the f32-activation kernels (WREN_CUDA_DECODE);
#   4. check_decode_speed's per-kernel-group breakdown at 4K.
# usage (on the GPU machine, in the pack): ./device_decode.sh OUT_DIR [DECODE_CTXS]
set -u
cd "$(dirname "$0")"
out=${1:-/tmp/out}
ctxs=${2:-256,4096,32768,131072}
repo=$(cd "${REPO:-../..}" && pwd)
mkdir -p "$out"
export LD_LIBRARY_PATH=$PWD/lib
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,memory.total --format=csv,noheader

echo "== decode kernel checks"
$repo/bench/cuda_checks.sh cuda_checks 2>&1
echo "== decode GEMV kinds (us per launch, GB/s of weights)"
timeout 120 ./cuda_checks/bench_decode_gemv 20 2>&1
if [ -n "${NCU:-}" ]; then
  echo "== ncu: each decode GEMV kind once"
  timeout 180 ncu --clock-control none --section SpeedOfLight --section WarpStateStats \
    --section Occupancy --section LaunchStats ./cuda_checks/bench_decode_gemv once > "$out/ncu.txt" 2>&1
  grep -E "qgemv_kernel|qdown_kernel|Duration|Memory Throughput|DRAM Throughput|Warp Cycles Per Issued|Achieved Occupancy|Registers Per|Stall|Issued Warp" "$out/ncu.txt" | head -120
  echo "== ncu: router source hot spots"
  timeout 120 ncu --clock-control none -k regex:qgemv_kernel --launch-skip 4 --launch-count 1 \
    --section SourceCounters --section WarpStateStats --print-details all \
    ./cuda_checks/bench_decode_gemv once > "$out/ncu_router.txt" 2>&1
  grep -iE "stall|line|\.cu:|Duration" "$out/ncu_router.txt" | head -60
fi
echo "== CUDA vs CPU, tiny models"
timeout 300 $repo/bench/cuda_vs_cpu.sh ./wren ./wren cuda_checks /tmp/cvc 2>&1 | grep -E "==|ok|FAIL|worst|agree|greedy" | head -40

echo "== full-size model"
t0=$(date +%s)
./wren synth --preset qwen3.6-35b-a3b --no-vision --out /dev/shm/m | tail -1
echo "synthesized in $(( $(date +%s) - t0 )) s"
timeout 300 ./wren bench -m /dev/shm/m --backend cuda --repeat 2 --gen 64 --decode "$ctxs" \
  --json "$out/bench_decode.json" 2>&1 | grep -v "^load"
for mode in ${MODES:-nopdl f32gemv}; do
  echo "-- WREN_CUDA_DECODE=$mode"
  WREN_CUDA_DECODE=$mode timeout 120 ./wren bench -m /dev/shm/m --backend cuda --repeat 2 --gen 64 \
    --decode 4096 2>&1 | tail -2
done
echo "== decode breakdown (non-graph step, events per launcher)"
timeout 180 ./cuda_checks/check_decode_speed /dev/shm/m ${BREAKDOWN:-4096} 64 2>&1 | tail -25
nvidia-smi --query-gpu=clocks.sm,clocks.mem,memory.used --format=csv,noheader
