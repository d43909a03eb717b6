#!/usr/bin/env bash
# The int8 KV cache (--kv-cache int8) on the GPU, in one device call, from a folder packed by
# tools/devpack.sh inside the repository (REPO, default ../..):
#   1. the attention checks (decode, prefill) and every decode kernel check;
#   2. the tiny fixtures' logits vs the HF reference with the int8 cache (CPU, CUDA, CUDA decode
#      path), against the bf16 cache; CUDA vs CPU end to end with int8 on both;
#   3. wren bench --backend cuda on the synthesized Qwen3.6-35B-A3B with either cache.
# usage (on the GPU machine, in the pack): ./device_kv8.sh OUT_DIR
set -u
cd "$(dirname "$0")"
out=${1:-/tmp/out}
repo=$(cd "${REPO:-../..}" && pwd)
ref=$repo/tests/fixtures/ref
mkdir -p "$out"
export LD_LIBRARY_PATH=$PWD/lib
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,memory.total --format=csv,noheader

echo "== attention checks"
timeout 300 ./cuda_checks/check_decode_attn > "$out/check_decode_attn.log" 2>&1
echo "check_decode_attn: exit $? ($(grep -c '^ok' "$out/check_decode_attn.log") ok)"
grep -E "FAIL|int8" "$out/check_decode_attn.log" | head -30
timeout 300 ./cuda_checks/check_prefill_attn > "$out/check_prefill_attn.log" 2>&1
echo "check_prefill_attn: exit $? ($(grep -c ' ok$' "$out/check_prefill_attn.log") ok, $(grep -c FAIL "$out/check_prefill_attn.log") FAIL)"
grep -E "FAIL|int8" "$out/check_prefill_attn.log" | head -40
if [ -z "${QUICK:-}" ]; then # QUICK=1: the attention checks, the fixtures and the bench only
  echo "== decode kernel checks"
  $repo/bench/cuda_checks.sh cuda_checks 2>&1
fi

echo "== tiny fixtures vs HF reference, int8 KV cache"
python3 $repo/tools/make_fixtures.py /tmp/fx > /dev/null && (cd /tmp/fx && sha256sum -c --quiet "$ref/SHA256SUMS" && echo "fixtures byte-identical to the reference ones")
for m in tiny-hf tiny-mlx4 tiny-mlx8; do
  L="./wren logits -m /tmp/fx/$m --tokens-file $ref/tokens.json"
  $L --out /tmp/fx/$m.cpu.f32 --backend cpu || echo "logits $m cpu failed"
  $L --out /tmp/fx/$m.cuda.f32 --backend cuda || echo "logits $m cuda failed"
  $L --out /tmp/fx/$m.cpu8.f32 --backend cpu --kv-cache int8 || echo "logits $m cpu int8 failed"
  $L --out /tmp/fx/$m.cuda8.f32 --backend cuda --kv-cache int8 || echo "logits $m cuda int8 failed"
  $L --out /tmp/fx/$m.cuda8d.f32 --backend cuda --kv-cache int8 --prefill-chunk 1 || echo "logits $m cuda int8 chunk 1 failed"
done
REF=$ref python3 - <<'PY'
import os
import numpy as np
def L(p): return np.fromfile(p, dtype="<f4").reshape(600, -1)
r = lambda a, b: np.linalg.norm(a - b) / np.linalg.norm(b)
for m in ["tiny-hf", "tiny-mlx4", "tiny-mlx8"]:
    ref = L(os.environ["REF"] + f"/{m}.f32")
    cpu8 = L(f"/tmp/fx/{m}.cpu8.f32")
    for tag in ["cpu", "cuda", "cpu8", "cuda8", "cuda8d"]:
        try: x = L(f"/tmp/fx/{m}.{tag}.f32")
        except Exception as e: print(m, tag, "missing", e); continue
        print(f"{m:10s} {tag:6s} vs HF ref: rel L2 {r(x, ref):.3e} top1 {(x.argmax(1) == ref.argmax(1)).mean():.4f}"
              f" | vs CPU int8: rel L2 {r(x, cpu8):.3e} top1 {(x.argmax(1) == cpu8.argmax(1)).mean():.4f}")
PY
[ -z "${QUICK:-}" ] && for m in tiny-hf tiny-mlx4 tiny-mlx8; do
  echo "-- e2e int8 $m"
  timeout 300 ./cuda_checks/check_decode_e2e /tmp/fx/$m 64 int8 2>&1 | grep -E "FAIL|ok|int8|passed|rel L2"
done

echo "== bench, synthesized Qwen3.6-35B-A3B"
./wren synth --preset qwen3.6-35b-a3b --no-vision --out /dev/shm/m > /dev/null || echo "synth failed"
for kv in ${KVS:-default int8}; do
  echo "-- kv cache $kv"
  ./wren bench -m /dev/shm/m --backend cuda --repeat 2 --gen 64 --prefill 4096 \
    --decode ${DECODE:-4096,32768,131072} --kv-cache $kv 2>&1 | grep -vE "^\s*$"
done
