#!/usr/bin/env bash
# Decode speed on the full-size synthesized Qwen3.6-35B-A3B (MLX 4-bit) on the GPU machine:
# synthesizes it (unless present), then runs check_decode_speed at the listed contexts.
# usage: bench/cuda_decode.sh SYNTH_WREN CHECK_DIR [MODEL_DIR] [CTXS] [GEN]
set -euo pipefail
synth=$1 checks=$2 m=${3:-/tmp/m} ctxs=${4:-256,1024,4096,16384,32768,65536,131072} gen=${5:-128}
if [ ! -f "$m/config.json" ]; then
  t0=$(date +%s)
  "$synth" synth --preset qwen3.6-35b-a3b --out "$m" | tail -1
  echo "synthesized in $(( $(date +%s) - t0 )) s"
fi
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,memory.used --format=csv,noheader || true
"$checks/check_decode_speed" "$m" "$ctxs" "$gen"
