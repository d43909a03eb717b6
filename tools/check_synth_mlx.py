#!/usr/bin/env python3
"""Cross-checks a `wren synth` checkpoint with mlx-lm (run by hand; not part of ctest).

Loads the checkpoint with mlx_lm.utils.load_model(strict=True), which builds mlx-lm's own
Qwen3.5-MoE model from config.json (quantization overrides included) and refuses any missing,
extra or mis-shaped tensor; then runs a forward pass and prints the residual stream per layer,
the logits and how many experts layer 0 routes 64 random tokens to.
Used with mlx==0.32.4 (mlx-cpu), mlx-lm==0.32.2, safetensors==0.8.0, numpy==2.4.6.
usage: python tools/check_synth_mlx.py CHECKPOINT_DIR
"""
import sys, glob
from pathlib import Path
import numpy as np
import mlx.core as mx
from mlx.utils import tree_flatten
from mlx_lm.utils import load_model
from mlx_lm.models.base import create_attention_mask
from safetensors import safe_open
path = sys.argv[1]
model, config = load_model(Path(path), lazy=False, strict=True)
params = dict(tree_flatten(model.parameters()))
ours = {}
for f in glob.glob(path + "/*.safetensors"):
    with safe_open(f, "numpy") as s:
        for k in s.keys():
            sl = s.get_slice(k); ours[k] = (sl.get_dtype(), tuple(sl.get_shape()))
lang = {k for k in ours if not k.startswith("vision_tower")}
print("mlx-lm params", len(params), "ours (language)", len(lang), "same names", set(params) == lang,
      "same shapes", all(tuple(params[k].shape) == ours[k][1] for k in params))
rng = np.random.default_rng(0)
x = mx.array(rng.integers(0, config["text_config"]["vocab_size"], size=(1, 64)))
lm = model.language_model.model
h = lm.embed_tokens(x)
for i, layer in enumerate(lm.layers):
    h = layer(h, mask=None if layer.is_linear else create_attention_mask(h, None), cache=None)
    a = np.array(h.astype(mx.float32))
    print("layer %2d %-6s rms %.3f max %.3f finite %s" % (i, "linear" if layer.is_linear else "attn", np.sqrt((a**2).mean()), np.abs(a).max(), np.isfinite(a).all()))
l = np.array(model(x).astype(mx.float32))
print("logits finite", np.isfinite(l).all(), "std %.3f" % l.std(), "max %.3f" % np.abs(l).max())
layer = lm.layers[0]
g = mx.softmax(layer.mlp.gate(layer.post_attention_layernorm(lm.embed_tokens(x))).astype(mx.float32), axis=-1)
top = np.argsort(-np.array(g), axis=-1)[..., :layer.mlp.top_k]
print("layer 0: 64 random tokens use", len(set(top.ravel().tolist())), "of", g.shape[-1], "experts")
