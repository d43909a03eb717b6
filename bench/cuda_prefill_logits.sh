#!/usr/bin/env bash
# Integration check of the CUDA prefill on the GPU machine: logits of the tiny fixture checkpoints
# (tests/fixtures) from `wren logits --backend cuda` at several prefill chunks (1 = the decode
# path) vs HF transformers' reference logits, vs the CPU backend, and chunked vs one chunk.
# Bar (issue): rel L2 <= 2e-2 and top-1 >= 98% vs the references; chunked vs one chunk <= 2e-3.
# usage (in the pack, which sits at REPO/.devwork/NAME): ./cuda_prefill_logits.sh
set -u
cd "$(dirname "$0")"
root=$(cd ../.. && pwd)
fx=/tmp/wren-fixtures
python3 "$root/tools/make_fixtures.py" "$fx" >/dev/null || { echo "make_fixtures failed"; exit 1; }
for m in tiny-hf tiny-mlx4 tiny-mlx8; do
  for be in cpu cuda; do
    for ch in 1 100 600; do
      [ "$be" = cpu ] && [ "$ch" != 100 ] && continue
      ./wren logits -m "$fx/$m" --tokens-file "$fx/tokens.json" --out "/tmp/l_${m}_${be}_${ch}.f32" \
        --backend "$be" --prefill-chunk "$ch" 2>/tmp/err_${m}_${be}_${ch}.txt || { echo "$m $be $ch failed:"; cat /tmp/err_${m}_${be}_${ch}.txt; }
    done
  done
done
python3 - "$root" <<'PY'
import os, sys
import numpy as np
root = sys.argv[1]
fail = 0
def load(p): return np.fromfile(p, dtype=np.float32).reshape(600, -1)
def cmp(name, a, b, tol, top):
    global fail
    rel = float(np.linalg.norm(a - b) / np.linalg.norm(b))
    t1 = float((a.argmax(1) == b.argmax(1)).mean())
    ok = rel <= tol and t1 >= top
    fail |= not ok
    print(f"{name:48s} rel_l2 {rel:.3e} (tol {tol:.0e}) top-1 {t1*100:.1f}% {'ok' if ok else 'FAIL'}")
for m in ("tiny-hf", "tiny-mlx4", "tiny-mlx8"):
    ref = load(os.path.join(root, "tests/fixtures/ref", m + ".f32"))
    try:
        cpu = load(f"/tmp/l_{m}_cpu_100.f32")
        cmp(f"{m} cpu chunk 100 vs HF", cpu, ref, 1e-3, 0.995)
    except Exception as ex:
        print(m, "cpu:", ex); fail = 1; cpu = None
    for ch in (1, 100, 600):
        try:
            g = load(f"/tmp/l_{m}_cuda_{ch}.f32")
        except Exception as ex:
            print(m, "cuda", ch, ex); fail = 1; continue
        cmp(f"{m} cuda chunk {ch} vs HF", g, ref, 2e-2, 0.98)
        if cpu is not None: cmp(f"{m} cuda chunk {ch} vs cpu", g, cpu, 2e-2, 0.98)
    try:
        cmp(f"{m} cuda chunk 100 vs cuda 600", load(f"/tmp/l_{m}_cuda_100.f32"), load(f"/tmp/l_{m}_cuda_600.f32"), 2e-3, 0.98)
    except Exception as ex:
        print(ex)
print("cuda_prefill_logits:", "FAIL" if fail else "all ok")
PY
