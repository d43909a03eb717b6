"""wren perplexity agrees with the logits it is computed from, and wren bench writes sane JSON."""
import json
import os
import re
import subprocess

import numpy as np

from fixtures_util import fixtures_dir, load_tokens, tokens_file  # noqa: F401

WREN = os.environ["WREN_BIN"]


def test_perplexity_matches_logits(fixtures_dir, tmp_path):  # noqa: F811
    model = os.path.join(fixtures_dir, "tiny-mlx4")
    out = subprocess.run([WREN, "perplexity", "-m", model, "--tokens-file", tokens_file(), "--backend",
                          "cpu", "--window", "37"], check=True, capture_output=True, text=True).stdout
    ppl = float(re.search(r"perplexity ([0-9.]+)", out).group(1))
    subprocess.run([WREN, "logits", "-m", model, "--tokens-file", tokens_file(), "--out",
                    str(tmp_path / "l.f32"), "--backend", "cpu"], check=True)
    toks = load_tokens()
    logits = np.fromfile(tmp_path / "l.f32", dtype="<f4").reshape(len(toks), -1).astype(np.float64)
    lse = np.log(np.exp(logits - logits.max(1, keepdims=True)).sum(1)) + logits.max(1)
    nll = lse[:-1] - logits[np.arange(len(toks) - 1), toks[1:]]
    assert abs(ppl - np.exp(nll.mean())) <= 1e-3 * ppl, (ppl, np.exp(nll.mean()))


def test_bench_json(fixtures_dir, tmp_path):  # noqa: F811
    model = os.path.join(fixtures_dir, "tiny-mlx8")
    j = tmp_path / "b.json"
    out = subprocess.run([WREN, "bench", "-m", model, "--backend", "cpu", "--prefill", "64,128",
                          "--decode", "32", "--gen", "4", "--repeat", "1", "--json", str(j)],
                         check=True, capture_output=True, text=True).stdout
    r = json.loads(j.read_text())
    assert r["backend"] == "cpu" and r["weight_bytes"] > 0
    assert [p["tokens"] for p in r["prefill"]] == [64, 128]
    assert all(p["tok_s"] > 0 and p["seconds"] > 0 and p["tflops"] > 0 for p in r["prefill"])
    (d,) = r["decode"]
    assert d["context"] == 32 and d["tok_s"] > 0 and d["bytes_per_token"] > 0
    assert abs(d["tok_s"] * d["ms_per_token"] - 1e3) < 1e-6 * 1e3
    assert "decode@ctx" in out and "prefill" in out


def test_bench_sampled_decode(fixtures_dir, tmp_path):  # noqa: F811
    # decode with a sampler instead of greedy: reported in the table and the JSON
    j = tmp_path / "s.json"
    out = subprocess.run([WREN, "bench", "-m", os.path.join(fixtures_dir, "tiny-mlx8"), "--backend", "cpu",
                          "--decode", "16", "--gen", "4", "--repeat", "1", "--temp", "0.8", "--top-k", "20",
                          "--top-p", "0.95", "--min-p", "0.01", "--json", str(j)],
                         check=True, capture_output=True, text=True).stdout
    assert "sampler: temperature 0.8, top-k 20, top-p 0.95, min-p 0.01" in out, out
    r = json.loads(j.read_text())
    want = {"temperature": 0.8, "top_k": 20, "top_p": 0.95, "min_p": 0.01}
    assert r["decode_sampler"].keys() == want.keys(), r["decode_sampler"]
    assert all(abs(r["decode_sampler"][k] - v) < 1e-6 for k, v in want.items()), r["decode_sampler"]
    assert r["decode"][0]["tok_s"] > 0
    p = subprocess.run([WREN, "bench", "-m", os.path.join(fixtures_dir, "tiny-mlx8"), "--top-p", "1.5"],
                       capture_output=True, text=True)
    assert p.returncode == 2 and "--top-p" in p.stderr, p.stderr


def test_bench_rejects_bad_lists(fixtures_dir):  # noqa: F811
    p = subprocess.run([WREN, "bench", "-m", os.path.join(fixtures_dir, "tiny-mlx8"), "--prefill", "12,x"],
                       capture_output=True, text=True)
    assert p.returncode == 2 and "--prefill" in p.stderr


def test_perplexity_rejects_out_of_range_target(fixtures_dir, tmp_path):  # noqa: F811
    # the last token is only a target (never fed), so it needs its own range check
    toks = tmp_path / "t.json"
    toks.write_text(json.dumps([1, 2, 3, 2000000000]))
    p = subprocess.run([WREN, "perplexity", "-m", os.path.join(fixtures_dir, "tiny-mlx4"), "--tokens-file",
                        str(toks), "--backend", "cpu"], capture_output=True, text=True)
    assert p.returncode == 1 and "out of range" in p.stderr, (p.returncode, p.stderr)
