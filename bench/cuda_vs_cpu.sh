#!/usr/bin/env bash
# CUDA vs CPU on a tiny synthesized checkpoint (run on the GPU machine): the end-to-end check
# (decode-step and forward logits rel L2 <= 2e-2, top-1 >= 98%, first 32 greedy tokens equal,
# snapshot + seeded sampling determinism), then `wren logits` of both backends compared in numpy.
# usage: bench/cuda_vs_cpu.sh WREN SYNTH_WREN CHECK_DIR [WORKDIR]
set -uo pipefail
wren=$1 synth=$2 checks=$3 work=${4:-/tmp/cvc}
rm -rf "$work" && mkdir -p "$work"
# 3 layers: DeltaNet + MoE only (no KV cache): every position must match (strict)
for layers in 3 8 12; do
  m=$work/tiny$layers
  "$synth" synth --preset tiny --layers $layers --seed $layers --out "$m" >/dev/null
  echo "== tiny model, $layers layers"
  "$checks/check_decode_e2e" "$m" 96 $([ $layers = 3 ] && echo strict) || true
  python3 -c "import json,random; random.seed(1); json.dump([random.randrange(1000) for _ in range(48)], open('$work/t.json','w'))"
  "$wren" logits -m "$m" --backend cpu --tokens-file "$work/t.json" --out "$work/cpu.f32"
  "$wren" logits -m "$m" --backend cuda --tokens-file "$work/t.json" --out "$work/cuda.f32"
  python3 - "$work" <<'PY'
import sys, numpy as np
w = sys.argv[1]
a = np.fromfile(w + "/cpu.f32", dtype=np.float32); b = np.fromfile(w + "/cuda.f32", dtype=np.float32)
T = 48; a = a.reshape(T, -1); b = b.reshape(T, -1)
rel = np.linalg.norm(b - a, axis=1) / np.linalg.norm(a, axis=1)
top1 = (a.argmax(1) == b.argmax(1)).mean()
print(f"wren logits cuda vs cpu: worst rel L2 {rel.max():.2e}, top-1 {top1*100:.1f}%  ->", "ok" if rel.max() <= 2e-2 and top1 >= 0.98 else "FAIL")
PY
done
