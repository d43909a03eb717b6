#!/usr/bin/env bash
# Runs the prefill kernel checks and benchmarks on the GPU machine, from a pack made by
#   tools/devpack.sh BUILD /work/main/.devwork/cudapre && cp bench/cuda_prefill.sh /work/main/.devwork/cudapre/
# usage (in the pack): LD_LIBRARY_PATH=$PWD/lib ./cuda_prefill.sh [checks] [kernels] [sweep] [chunks]
set -u
cd "$(dirname "$0")"
parts=${*:-checks kernels sweep chunks}
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,memory.total --format=csv,noheader
for part in $parts; do
  case $part in
    checks)
      for c in gemm moe dn attn model; do timeout 120 ./cuda_checks/check_prefill_$c || echo "check_prefill_$c: exit $?"; done ;;
    kernels)
      python3 - <<'PY' || true
import torch, time
a = torch.randn(8192, 8192, dtype=torch.bfloat16, device="cuda"); b = torch.randn_like(a)
for _ in range(3): a @ b
torch.cuda.synchronize(); t = time.perf_counter()
for _ in range(10): a @ b
torch.cuda.synchronize(); dt = (time.perf_counter() - t) / 10
print(f"torch bf16 matmul 8192^3: {2 * 8192**3 / dt / 1e12:.0f} TFLOP/s")
PY
      for c in gemm moe dn attn; do timeout 90 ./cuda_checks/check_prefill_$c --bench | grep -E "^bench|FAIL"; done ;;
    sweep)
      timeout 300 ./cuda_checks/check_prefill_bench 4096 256 512 1024 2048 4096 8192 16384 32768 65536 131072 ;;
    chunks)
      for ch in 1024 2048 8192 16384; do timeout 60 ./cuda_checks/check_prefill_bench $ch 16384; done ;;
  esac
done
