#!/usr/bin/env bash
# The integrated GPU run, in one device call, from a folder packed by tools/devpack.sh inside the
# repository (REPO, default ../..: fixtures, tokenizer and scripts are read from there):
#   1. the card's ceilings (device copy bandwidth, bf16 matmul) via torch;
#   2. every standalone CUDA kernel check (decode and prefill);
#   3. CUDA vs CPU vs HF-reference logits on the tiny fixtures (both formats), greedy CLI runs,
#      and CPU vs CUDA decode vs CUDA prefill on a 4-layer model of the real dimensions;
#   4. wren bench --backend cuda on the full-size synthesized Qwen3.6-35B-A3B (prefill + decode,
#      and decode with the models' own sampler), and the sampler kernels alone (bench_sample);
#   5. the per-node cost of an empty-kernel graph (check_decode_speed) for the decode analysis.
# usage (on the GPU machine, in the pack): ./device_final.sh OUT_DIR
set -u
cd "$(dirname "$0")"
out=${1:-/tmp/out}
repo=$(cd "${REPO:-../..}" && pwd)
ref=$repo/tests/fixtures/ref
mkdir -p "$out"
export LD_LIBRARY_PATH=$PWD/lib
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,memory.total --format=csv,noheader

echo "== ceilings"
python3 - <<'PY' || true
import torch, time
x = torch.empty(2 * 1024**3, dtype=torch.uint8, device="cuda"); y = torch.empty_like(x)
for _ in range(3): y.copy_(x)
torch.cuda.synchronize(); t = time.perf_counter()
for _ in range(10): y.copy_(x)
torch.cuda.synchronize(); dt = (time.perf_counter() - t) / 10
print(f"device copy: {2 * x.numel() / dt / 1e9:.0f} GB/s (read + write)")
a = torch.randn(8192, 8192, dtype=torch.bfloat16, device="cuda"); b = torch.randn_like(a)
for _ in range(3): a @ b
torch.cuda.synchronize(); t = time.perf_counter()
for _ in range(10): a @ b
torch.cuda.synchronize(); dt = (time.perf_counter() - t) / 10
print(f"bf16 matmul 8192^3: {2 * 8192**3 / dt / 1e12:.0f} TFLOP/s")
PY

echo "== decode kernel checks"
$repo/bench/cuda_checks.sh cuda_checks 2>&1
echo "== prefill kernel checks"
for c in gemm moe dn attn model; do
  timeout 120 ./cuda_checks/check_prefill_$c > "$out/check_prefill_$c.log" 2>&1
  echo "check_prefill_$c: exit $? ($(grep -c ' ok$' "$out/check_prefill_$c.log") ok, $(grep -c FAIL "$out/check_prefill_$c.log") FAIL)"
done

echo "== CUDA vs CPU vs HF reference (tiny fixtures)"
python3 $repo/tools/make_fixtures.py /tmp/fx > /dev/null && (cd /tmp/fx && sha256sum -c --quiet "$ref/SHA256SUMS" && echo "fixtures byte-identical to the reference ones")
for m in tiny-hf tiny-mlx4 tiny-mlx8; do
  for be in cpu cuda; do
    ./wren logits -m /tmp/fx/$m --tokens-file $ref/tokens.json --out /tmp/fx/$m.$be.f32 --backend $be || echo "logits $m $be failed"
  done
  ./wren logits -m /tmp/fx/$m --tokens-file $ref/tokens.json --out /tmp/fx/$m.cuda1.f32 --backend cuda --prefill-chunk 1 || echo "logits $m cuda chunk 1 failed"
  ./wren logits -m /tmp/fx/$m --tokens-file $ref/tokens.json --out /tmp/fx/$m.cudamix.f32 --backend cuda --decode-from 300 || echo "logits $m cuda decode-from failed"
done
REF=$ref python3 - <<'PY'
import os
import numpy as np
def L(p): return np.fromfile(p, dtype="<f4").reshape(600, -1)
for m in ["tiny-hf", "tiny-mlx4", "tiny-mlx8"]:
    ref = L(os.environ["REF"] + f"/{m}.f32")
    for tag in ["cpu", "cuda", "cuda1", "cudamix"]:
        try: x = L(f"/tmp/fx/{m}.{tag}.f32")
        except Exception as e: print(m, tag, "missing", e); continue
        cpu = L(f"/tmp/fx/{m}.cpu.f32")
        r = lambda a, b: np.linalg.norm(a - b) / np.linalg.norm(b)
        print(f"{m:10s} {tag:6s} vs HF ref: rel L2 {r(x, ref):.3e} top1 {(x.argmax(1) == ref.argmax(1)).mean():.4f}"
              f" | vs CPU: rel L2 {r(x, cpu):.3e} top1 {(x.argmax(1) == cpu.argmax(1)).mean():.4f}")
PY
./wren synth --preset tiny --tokenizer $repo/data/tokenizers/qwen3 --out /tmp/tinyq > /dev/null
for be in cpu cuda; do
  ./wren run -m /tmp/tinyq --backend $be --temp 0 --max-tokens 32 --raw -p "The quick brown fox" --log /tmp/run_$be.jsonl > /tmp/run_$be.txt 2> /tmp/run_$be.err || { echo "run $be failed"; cat /tmp/run_$be.err; }
done
python3 - <<'PY'
import json
a = json.loads(open("/tmp/run_cpu.jsonl").readline())["generated"]
b = json.loads(open("/tmp/run_cuda.jsonl").readline())["generated"]
n = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
print(f"greedy run, tiny model: CPU and CUDA agree on the first {n} of {len(a)} tokens")
p = json.loads(open("/tmp/run_cpu.jsonl").readline())["prompt"]
json.dump(p + a, open("/tmp/tf.json", "w"))
open("/tmp/tf_n", "w").write(str(len(p)))
PY
./wren logits -m /tmp/tinyq --tokens-file /tmp/tf.json --out /tmp/tf_cpu.f32 --backend cpu
./wren logits -m /tmp/tinyq --tokens-file /tmp/tf.json --out /tmp/tf_cuda.f32 --backend cuda --decode-from "$(cat /tmp/tf_n)"
python3 - <<'PY'
import json, numpy as np
toks = json.load(open("/tmp/tf.json")); P = int(open("/tmp/tf_n").read())
V = np.fromfile("/tmp/tf_cpu.f32", dtype="<f4").size // len(toks)
c = np.fromfile("/tmp/tf_cpu.f32", dtype="<f4").reshape(len(toks), V)[P - 1:-1]
g = np.fromfile("/tmp/tf_cuda.f32", dtype="<f4").reshape(len(toks), V)[P - 1:-1]
srt = np.sort(c, axis=1)
gap = srt[:, -1] - srt[:, -2]
agree = (g.argmax(1) == c.argmax(1))
print(f"teacher-forced on the CPU's greedy tokens (prefill {P}, then decode): CUDA top-1 agrees at "
      f"{agree.sum()}/{len(agree)}; rel L2 {np.linalg.norm(g - c) / np.linalg.norm(c):.3e}; "
      f"CPU top1-top2 gaps where they differ: {np.round(gap[~agree], 4).tolist()} "
      f"(median gap overall {np.median(gap):.4f}, logit std {c.std():.3f})")
PY
tail -1 /tmp/run_cuda.err

echo "== real dimensions, 4 layers (3 DeltaNet + 1 attention): CPU vs CUDA decode vs CUDA prefill"
# A random-weight model amplifies rounding through its layers (at 40 layers a float reassociation
# moves the logits by ~10%: RESULTS.md, twenty-fourth session), so the paths are compared at 4.
rm -rf /tmp/m4
./wren synth --preset qwen3.6-35b-a3b --no-vision --layers 4 --out /tmp/m4 | tail -1
python3 -c "import json, random; random.seed(7); json.dump([random.randrange(248000) for _ in range(48)], open('/tmp/t48.json', 'w'))"
./wren logits -m /tmp/m4 --tokens-file /tmp/t48.json --out /tmp/m4.cpu.f32 --backend cpu > /dev/null || echo "logits cpu failed"
./wren logits -m /tmp/m4 --tokens-file /tmp/t48.json --out /tmp/m4.dec.f32 --backend cuda --prefill-chunk 1 > /dev/null || echo "logits cuda decode failed"
./wren logits -m /tmp/m4 --tokens-file /tmp/t48.json --out /tmp/m4.pf.f32 --backend cuda > /dev/null || echo "logits cuda prefill failed"
python3 - <<'PY'
import numpy as np
L = lambda t: np.fromfile(f"/tmp/m4.{t}.f32", dtype="<f4").reshape(48, -1)
for a, b in [("dec", "cpu"), ("pf", "cpu"), ("pf", "dec")]:
    x, y = L(a), L(b)
    rel = np.linalg.norm(x - y, axis=1) / np.linalg.norm(y, axis=1)
    top1 = (x.argmax(1) == y.argmax(1)).mean()
    # the decode path against the issue's bar; the prefill's bf16 activations flip near-tied
    # expert choices of the random router at these sizes (numbers only: RESULTS.md)
    verdict = ("ok" if np.median(rel) <= 2e-2 and top1 >= 0.98 else "FAIL") if a == "dec" else ""
    print(f"{a:3s} vs {b:3s}: rel L2 median {np.median(rel):.2e} worst {rel.max():.2e}, top-1 {top1 * 100:.1f}%", verdict)
PY

echo "== full-size model"
t0=$(date +%s)
./wren synth --preset qwen3.6-35b-a3b --no-vision --out /dev/shm/m | tail -1
echo "synthesized in $(( $(date +%s) - t0 )) s"
timeout 400 ./wren bench -m /dev/shm/m --backend cuda --repeat 2 --gen 64 \
  --prefill 256,512,1024,2048,4096,8192,16384,32768,65536,131072 \
  --decode 256,1024,4096,16384,32768,65536,131072 --json "$out/bench.json" 2>&1
echo "== sampled decode (the models' own sampler: temperature 1, top-k 20, top-p 0.95)"
timeout 300 ./wren bench -m /dev/shm/m --backend cuda --repeat 2 --gen 64 --decode 4096,32768,131072 \
  --temp 1 --top-k 20 --top-p 0.95 2>&1 | grep -E "^(sampler|decode|4096|32768|131072) "
echo "== sampled decode without top-k (temperature 0.7, top-p 0.9: the random model's flat logits keep ~10^5 ids, selected over every block)"
timeout 120 ./wren bench -m /dev/shm/m --backend cuda --repeat 2 --gen 64 --decode 4096 \
  --temp 0.7 --top-p 0.9 2>&1 | grep -E "^(sampler|decode|4096) "
echo "== sampler kernels (us per call)"
timeout 120 ./cuda_checks/bench_sample 2>&1
echo "== decode GEMV kinds on the real shapes (us per launch, GB/s of weights)"
timeout 120 ./cuda_checks/bench_decode_gemv 20 2>&1
echo "== empty-graph node cost and decode breakdown"
timeout 120 ./cuda_checks/check_decode_speed /dev/shm/m 4096 64 2>&1 | tail -25
nvidia-smi --query-gpu=clocks.sm,clocks.mem,memory.used --format=csv,noheader
