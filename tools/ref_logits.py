#!/usr/bin/env python3
"""Reference logits for the tiny fixtures, computed by HF transformers (an independent
implementation) in float32.

usage: tools/ref_logits.py FIXTURES_DIR OUT_DIR [NAME ...]

FIXTURES_DIR is what tools/make_fixtures.py wrote. For each checkpoint NAME (default: tiny-hf,
tiny-mlx4, tiny-mlx8) writes OUT_DIR/NAME.f32: [n_tokens][vocab] float32 little-endian logits of
one forward pass over FIXTURES_DIR/tokens.json.

- tiny-hf is loaded by transformers itself (Qwen3_5MoeForCausalLM.from_pretrained), so its own
  name mapping, shard index and skip rules (model.visual.*, mtp.*) are exercised.
- MLX checkpoints are converted here into the HF text layout: affine-dequantized exactly from the
  stored uint32/bf16 values, switch_mlp re-fused into gate_up_proj, conv1d [C,K,1] -> [C,1,K],
  and the 1+w norm convention undone. The result is then loaded with a strict state-dict check.
The pure-torch code path is enforced: flash-linear-attention, causal-conv1d and hub kernels must
be absent (their kernels are not float32-exact), attention and experts use the eager code.
Needs torch and transformers (versions in tests/fixtures/README.md).
"""

import importlib.util
import json
import os
import sys

import torch
from safetensors.torch import load_file

import transformers
from transformers import Qwen3_5MoeForCausalLM, Qwen3_5MoeTextConfig

NAMES = ("tiny-hf", "tiny-mlx4", "tiny-mlx8")


def require_torch_path():
    """The optional packages transformers would prefer over its torch reference code."""
    for pkg in ("fla", "causal_conv1d", "kernels"):
        if importlib.util.find_spec(pkg) is not None:
            sys.exit(f"ref_logits: '{pkg}' is installed; uninstall it so the exact torch path runs")


def load_tensors(ckpt):
    index = os.path.join(ckpt, "model.safetensors.index.json")
    if os.path.exists(index):
        with open(index) as f:
            files = sorted(set(json.load(f)["weight_map"].values()))
    else:
        files = ["model.safetensors"]
    out = {}
    for fname in files:
        out.update(load_file(os.path.join(ckpt, fname)))
    return out


def dequant(packed, scales, biases, group_size, bits):
    """MLX affine: element j of a row is bits [bits*(j % (32/bits)), ...) of word j/(32/bits);
    w = scale * q + bias per group of group_size inputs."""
    per_word = 32 // bits
    words = packed.view(torch.int32).to(torch.int64) & 0xFFFFFFFF
    shifts = torch.arange(per_word, dtype=torch.int64) * bits
    q = (words.unsqueeze(-1) >> shifts) & ((1 << bits) - 1)
    q = q.reshape(*packed.shape[:-1], -1).to(torch.float64)
    n_in = q.shape[-1]
    if n_in != scales.shape[-1] * group_size:
        raise ValueError(f"inconsistent quantized shapes {tuple(packed.shape)} / {tuple(scales.shape)}")
    q = q.reshape(*q.shape[:-1], n_in // group_size, group_size)
    w = q * scales.to(torch.float64).unsqueeze(-1) + biases.to(torch.float64).unsqueeze(-1)
    return w.reshape(*packed.shape[:-1], n_in).to(torch.float32)


def mlx_to_hf_state(ckpt, text_cfg):
    with open(os.path.join(ckpt, "config.json")) as f:
        quant = json.load(f)["quantization"]
    raw = load_tensors(ckpt)
    dense = {}
    for name, t in raw.items():
        if name.startswith("vision_tower."):
            continue
        if name.endswith(".scales") or name.endswith(".biases"):
            continue
        module = name[: -len(".weight")] if name.endswith(".weight") else None
        if module is not None and module + ".scales" in raw:
            ov = quant.get(module)
            gs, bits = (ov["group_size"], ov["bits"]) if isinstance(ov, dict) else (quant["group_size"], quant["bits"])
            dense[name] = dequant(t, raw[module + ".scales"], raw[module + ".biases"], gs, bits)
        else:
            dense[name] = t.to(torch.float32)

    state = {}
    norms = (".input_layernorm.weight", ".post_attention_layernorm.weight", ".q_norm.weight", ".k_norm.weight")
    for name, t in dense.items():
        if name == "language_model.lm_head.weight":
            state["lm_head.weight"] = t
            continue
        if not name.startswith("language_model.model."):
            raise ValueError(f"unexpected tensor {name}")
        hf = "model." + name[len("language_model.model."):]
        if ".switch_mlp." in hf:
            base = hf.split(".switch_mlp.")[0] + ".experts."
            if hf.endswith("switch_mlp.gate_proj.weight"):
                up = dense[name.replace("gate_proj", "up_proj")]
                state[base + "gate_up_proj"] = torch.cat([t, up], dim=1)
            elif hf.endswith("switch_mlp.down_proj.weight"):
                state[base + "down_proj"] = t
            continue
        if hf.endswith("conv1d.weight"):
            t = t.permute(0, 2, 1).contiguous()  # [C,K,1] -> [C,1,K]
        elif hf.endswith(norms) or hf == "model.norm.weight":
            t = t - 1.0  # HF stores the zero-centred weight (w_eff = 1 + w); exact in f32
        state[hf] = t
    return state


def build_model(ckpt):
    common = dict(attn_implementation="eager", experts_implementation="eager")
    with open(os.path.join(ckpt, "config.json")) as f:
        config = json.load(f)
    if "quantization" not in config:
        model, info = Qwen3_5MoeForCausalLM.from_pretrained(
            ckpt, dtype=torch.float32, output_loading_info=True, **common
        )
        bad = {k: v for k, v in info.items() if v}
        if bad:
            sys.exit(f"ref_logits: {ckpt}: transformers loading problems: {bad}")
        return model
    cfg = Qwen3_5MoeTextConfig(**config["text_config"])
    model = Qwen3_5MoeForCausalLM._from_config(cfg, dtype=torch.float32, **common)
    state = mlx_to_hf_state(ckpt, cfg)
    missing, unexpected = model.load_state_dict(state, strict=False)
    if missing or unexpected:
        sys.exit(f"ref_logits: {ckpt}: missing {missing}, unexpected {unexpected}")
    return model


@torch.no_grad()
def logits_for(ckpt, tokens):
    """Returns (logits [T, vocab] f32, smallest gap between the k-th and (k+1)-th router logit
    over all tokens and layers: how close the reference came to a routing tie)."""
    model = build_model(ckpt).eval()
    for p in model.parameters():
        assert p.dtype == torch.float32
    assert model.config._attn_implementation == "eager"
    margins = []

    def router_margin(router, inputs, outputs):
        top = outputs[0].topk(router.top_k + 1, dim=-1).values
        margins.append((top[:, -2] - top[:, -1]).min().item())

    for layer in model.model.layers:
        layer.mlp.gate.register_forward_hook(router_margin)
    ids = torch.tensor([tokens], dtype=torch.long)
    out = model(input_ids=ids, use_cache=False)
    return out.logits[0].to(torch.float32).contiguous(), min(margins)


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    fixtures, outdir = sys.argv[1], sys.argv[2]
    names = sys.argv[3:] or NAMES
    require_torch_path()
    torch.manual_seed(0)
    torch.set_num_threads(max(1, os.cpu_count() or 1))
    print(f"torch {torch.__version__}, transformers {transformers.__version__}", file=sys.stderr)
    with open(os.path.join(fixtures, "tokens.json")) as f:
        tokens = json.load(f)
    os.makedirs(outdir, exist_ok=True)
    for name in names:
        logits, router_margin = logits_for(os.path.join(fixtures, name), tokens)
        if not torch.isfinite(logits).all():
            sys.exit(f"ref_logits: {name}: non-finite logits")
        path = os.path.join(outdir, name + ".f32")
        with open(path, "wb") as f:
            f.write(logits.numpy().astype("<f4").tobytes())
        top2 = logits.topk(2, dim=-1)
        print(f"{name}: {tuple(logits.shape)} std {logits.std().item():.3f}, "
              f"distinct top-1 {len(set(top2.indices[:, 0].tolist()))}, "
              f"min top-1 margin {(top2.values[:, 0] - top2.values[:, 1]).min().item():.2e}, "
              f"min router top-k margin {router_margin:.2e}", file=sys.stderr)


if __name__ == "__main__":
    main()
