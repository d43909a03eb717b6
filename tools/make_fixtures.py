#!/usr/bin/env python3
"""Writes tiny random-weight Qwen3.5/3.6 hybrid-MoE checkpoints for the logits tests.

usage: tools/make_fixtures.py OUTDIR [--seed N]

OUTDIR receives
  tiny-hf/    HF bf16 layout (Qwen3_5MoeForConditionalGeneration: nested text_config, names
              model.language_model.*, fused 3-D experts), sharded in two files with an index,
              plus dummy model.visual.* and mtp.* tensors that an engine must skip;
  tiny-mlx4/  MLX affine 4-bit group 64 (router and shared_expert_gate 8-bit through per-module
              overrides, as mlx_lm.convert -q writes them), one file plus index, a dummy
              vision_tower.* tensor;
  tiny-mlx8/  MLX affine 8-bit group 32 (router overrides as above, and one module at 4-bit
              group 128), one file without an index;
  tokens.json 600 token ids.
All three checkpoints hold the same underlying model: the MLX ones are quantized from the bf16
weights of tiny-hf, the way mlx_lm.convert would do it. Output is byte-identical for a given seed
(numpy only; weights come from uniform draws and correctly rounded arithmetic, so no libm
difference can change a bit), which tests/fixtures/ref/SHA256SUMS checks.
"""

import argparse
import json
import math
import os
import struct
import sys
import zlib

import numpy as np

SEED = 22  # see tests/fixtures/README.md for why this one
N_TOKENS = 600

# Tiny dimensions with the real head geometry and layer structure of Qwen3.6-35B-A3B.
TEXT = {
    "hidden_size": 128,
    "num_hidden_layers": 8,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 256,
    "linear_num_key_heads": 2,
    "linear_num_value_heads": 4,
    "linear_key_head_dim": 128,
    "linear_value_head_dim": 128,
    "linear_conv_kernel_dim": 4,
    "num_experts": 16,
    "num_experts_per_tok": 4,
    "moe_intermediate_size": 128,
    "shared_expert_intermediate_size": 128,
    "vocab_size": 1024,
}
FULL_ATTENTION_INTERVAL = 4


def layer_types(n_layers):
    return [
        "full_attention" if (i + 1) % FULL_ATTENTION_INTERVAL == 0 else "linear_attention"
        for i in range(n_layers)
    ]


def text_config():
    """The text_config of the published checkpoint, with tiny sizes."""
    t = TEXT
    return {
        "attention_bias": False,
        "attention_dropout": 0.0,
        "attn_output_gate": True,
        "bos_token_id": None,
        "dtype": "bfloat16",
        "eos_token_id": 1,
        "full_attention_interval": FULL_ATTENTION_INTERVAL,
        "head_dim": t["head_dim"],
        "hidden_act": "silu",
        "hidden_size": t["hidden_size"],
        "initializer_range": 0.02,
        "layer_types": layer_types(t["num_hidden_layers"]),
        "linear_conv_kernel_dim": t["linear_conv_kernel_dim"],
        "linear_key_head_dim": t["linear_key_head_dim"],
        "linear_num_key_heads": t["linear_num_key_heads"],
        "linear_num_value_heads": t["linear_num_value_heads"],
        "linear_value_head_dim": t["linear_value_head_dim"],
        "mamba_ssm_dtype": "float32",
        "max_position_embeddings": 4096,
        "mlp_only_layers": [],
        "model_type": "qwen3_5_moe_text",
        "moe_intermediate_size": t["moe_intermediate_size"],
        "mtp_num_hidden_layers": 1,
        "mtp_use_dedicated_embeddings": False,
        "num_attention_heads": t["num_attention_heads"],
        "num_experts": t["num_experts"],
        "num_experts_per_tok": t["num_experts_per_tok"],
        "num_hidden_layers": t["num_hidden_layers"],
        "num_key_value_heads": t["num_key_value_heads"],
        "norm_topk_prob": True,
        "output_router_logits": False,
        "pad_token_id": None,
        "partial_rotary_factor": 0.25,
        "rms_norm_eps": 1e-06,
        "rope_parameters": {
            "mrope_interleaved": True,
            "mrope_section": [11, 11, 10],
            "partial_rotary_factor": 0.25,
            "rope_theta": 10000000,
            "rope_type": "default",
        },
        "router_aux_loss_coef": 0.001,
        "shared_expert_intermediate_size": t["shared_expert_intermediate_size"],
        "tie_word_embeddings": False,
        "use_cache": True,
        "vocab_size": t["vocab_size"],
    }


def vision_config():
    return {
        "deepstack_visual_indexes": [],
        "depth": 1,
        "hidden_act": "gelu_pytorch_tanh",
        "hidden_size": 32,
        "in_channels": 3,
        "initializer_range": 0.02,
        "intermediate_size": 64,
        "model_type": "qwen3_5_moe",
        "num_heads": 2,
        "num_position_embeddings": 64,
        "out_hidden_size": TEXT["hidden_size"],
        "patch_size": 16,
        "spatial_merge_size": 2,
        "temporal_patch_size": 2,
    }


def hf_config():
    return {
        "architectures": ["Qwen3_5MoeForConditionalGeneration"],
        "image_token_id": 1000,
        "model_type": "qwen3_5_moe",
        "text_config": text_config(),
        "tie_word_embeddings": False,
        "transformers_version": "5.17.0",
        "video_token_id": 1001,
        "vision_config": vision_config(),
        "vision_end_token_id": 1003,
        "vision_start_token_id": 1002,
    }


# ---------------------------------------------------------------------------------------------
# Deterministic draws. Each tensor gets its own stream keyed by its name, so adding a tensor
# does not change the others. Only uniform draws and exact arithmetic are used.


def stream(seed, name):
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence([seed, zlib.crc32(name.encode())])))


def uniform(seed, name, shape, lo, hi):
    u = stream(seed, name).random(shape, dtype=np.float64)
    return (lo + (hi - lo) * u).astype(np.float32)


def centred(seed, name, shape, std):
    """Zero-mean uniform values with the given standard deviation."""
    a = std * math.sqrt(3.0)  # sqrt is correctly rounded everywhere; pow need not be
    return uniform(seed, name, shape, -a, a)


def bf16_bits(x):
    """float32 -> bfloat16 bit patterns, round to nearest even (inputs are finite)."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    u = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    return u.astype(np.uint16)


def bf16_round(x):
    """The float32 value of x after a round trip through bfloat16."""
    return (bf16_bits(x).astype(np.uint32) << 16).view(np.float32)


def master_weights(seed):
    """The text model in HF naming and conventions (zero-centred norms), already bf16-rounded
    except A_log (float32 in the checkpoints)."""
    t = TEXT
    H = t["hidden_size"]
    nq, nkv, hd = t["num_attention_heads"], t["num_key_value_heads"], t["head_dim"]
    nk, nv, dk, dv = (t["linear_num_key_heads"], t["linear_num_value_heads"],
                      t["linear_key_head_dim"], t["linear_value_head_dim"])
    E, I, IS = t["num_experts"], t["moe_intermediate_size"], t["shared_expert_intermediate_size"]
    V, K = t["vocab_size"], t["linear_conv_kernel_dim"]
    conv_dim = 2 * nk * dk + nv * dv
    w = {}

    def lin(name, out_dim, in_dim, gain=1.0):
        w[name] = centred(seed, name, (out_dim, in_dim), gain / math.sqrt(in_dim))

    def znorm(name, dim):  # zero-centred HF norm: w_eff = 1 + w
        w[name] = centred(seed, name, (dim,), 0.1)

    w["embed_tokens.weight"] = centred(seed, "embed_tokens.weight", (V, H), 1.0)
    for i, kind in enumerate(layer_types(t["num_hidden_layers"])):
        p = f"layers.{i}."
        znorm(p + "input_layernorm.weight", H)
        znorm(p + "post_attention_layernorm.weight", H)
        if kind == "linear_attention":
            a = p + "linear_attn."
            lin(a + "in_proj_qkv.weight", conv_dim, H)
            lin(a + "in_proj_z.weight", nv * dv, H)
            lin(a + "in_proj_b.weight", nv, H)
            lin(a + "in_proj_a.weight", nv, H)
            lin(a + "out_proj.weight", H, nv * dv, 0.5)
            # Depthwise causal conv: taps of order 1/sqrt(K) keep the activations' scale.
            w[a + "conv1d.weight"] = centred(seed, a + "conv1d.weight", (conv_dim, 1, K), 0.5)
            w[a + "norm.weight"] = uniform(seed, a + "norm.weight", (dv,), 0.8, 1.2)
            # Decay g = exp(-exp(A_log) * softplus(a + dt_bias)): a spread of slow and fast heads.
            w[a + "A_log"] = uniform(seed, a + "A_log", (nv,), -3.0, 1.5)
            w[a + "dt_bias"] = uniform(seed, a + "dt_bias", (nv,), -1.0, 1.5)
        else:
            a = p + "self_attn."
            lin(a + "q_proj.weight", nq * hd * 2, H)
            lin(a + "k_proj.weight", nkv * hd, H)
            lin(a + "v_proj.weight", nkv * hd, H)
            lin(a + "o_proj.weight", H, nq * hd, 0.5)
            znorm(a + "q_norm.weight", hd)
            znorm(a + "k_norm.weight", hd)
        m = p + "mlp."
        lin(m + "gate.weight", E, H, 2.0)  # router logits of std ~2: peaked but not one-hot
        w[m + "experts.gate_up_proj"] = centred(seed, m + "experts.gate_up_proj", (E, 2 * I, H), 1 / math.sqrt(H))
        w[m + "experts.down_proj"] = centred(seed, m + "experts.down_proj", (E, H, I), 0.5 / math.sqrt(I))
        lin(m + "shared_expert.gate_proj.weight", IS, H)
        lin(m + "shared_expert.up_proj.weight", IS, H)
        lin(m + "shared_expert.down_proj.weight", H, IS, 0.5)
        lin(m + "shared_expert_gate.weight", 1, H)
    znorm("norm.weight", H)
    lin("lm_head.weight", V, H, 3.0)  # logits of std ~3: clear top-1 at most positions
    return {k: (v if k.endswith("A_log") else bf16_round(v)) for k, v in w.items()}


# ---------------------------------------------------------------------------------------------
# safetensors writer (the format: u64 LE header size, JSON header, raw little-endian data).

DTYPES = {"BF16": 2, "F32": 4, "U32": 4}


class Tensor:
    def __init__(self, dtype, shape, data):
        self.dtype, self.shape, self.data = dtype, list(shape), data


def bf16(x):
    return Tensor("BF16", x.shape, bf16_bits(x).astype("<u2").tobytes())


def f32(x):
    return Tensor("F32", x.shape, np.ascontiguousarray(x, dtype="<f4").tobytes())


def u32(x):
    return Tensor("U32", x.shape, np.ascontiguousarray(x, dtype="<u4").tobytes())


def write_safetensors(path, tensors, metadata):
    header = {"__metadata__": metadata}
    offset = 0
    for name in sorted(tensors):
        t = tensors[name]
        n = DTYPES[t.dtype] * int(np.prod(t.shape, dtype=np.int64))
        assert n == len(t.data), name
        header[name] = {"dtype": t.dtype, "shape": t.shape, "data_offsets": [offset, offset + n]}
        offset += n
    hjson = json.dumps(header, separators=(",", ":")).encode()
    hjson += b" " * (-len(hjson) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(hjson)))
        f.write(hjson)
        for name in sorted(tensors):
            f.write(tensors[name].data)


def write_json(path, obj):
    with open(path, "w") as f:
        json.dump(obj, f, indent=2)
        f.write("\n")


def write_index(path, shards):
    """model.safetensors.index.json for {file: {name: Tensor}}."""
    total = sum(len(t.data) for shard in shards.values() for t in shard.values())
    weight_map = {name: fname for fname, shard in shards.items() for name in shard}
    write_json(path, {"metadata": {"total_size": total},
                      "weight_map": dict(sorted(weight_map.items()))})


# ---------------------------------------------------------------------------------------------
# HF bf16 checkpoint


def write_hf(outdir, master, seed):
    os.makedirs(outdir, exist_ok=True)
    tensors = {}
    for k, v in master.items():
        name = k if k == "lm_head.weight" else "model.language_model." + k
        tensors[name] = f32(v) if k.endswith("A_log") else bf16(v)
    # Weights the text engine must skip: a vision tower and the MTP head.
    H = TEXT["hidden_size"]
    for name, shape in [
        ("model.visual.patch_embed.proj.weight", (32, 3, 2, 16, 16)),
        ("model.visual.blocks.0.attn.qkv.weight", (96, 32)),
        ("model.visual.merger.linear_fc2.weight", (H, 128)),
        ("mtp.fc.weight", (H, 2 * H)),
        ("mtp.layers.0.input_layernorm.weight", (H,)),
        ("mtp.norm.weight", (H,)),
    ]:
        tensors[name] = bf16(centred(seed, name, shape, 0.02))

    # Two shards split by size in name order, so a layer's tensors straddle the files like in
    # the published checkpoint.
    names = sorted(tensors)
    total = sum(len(tensors[n].data) for n in names)
    shards = {"model-00001-of-00002.safetensors": {}, "model-00002-of-00002.safetensors": {}}
    acc = 0
    for n in names:
        first = acc < total // 2
        acc += len(tensors[n].data)
        shards["model-0000%d-of-00002.safetensors" % (1 if first else 2)][n] = tensors[n]
    for fname, shard in shards.items():
        write_safetensors(os.path.join(outdir, fname), shard, {"format": "pt"})
    write_index(os.path.join(outdir, "model.safetensors.index.json"), shards)
    write_json(os.path.join(outdir, "config.json"), hf_config())


# ---------------------------------------------------------------------------------------------
# MLX affine quantization


def quantize(w, group_size, bits):
    """MLX affine quantization of w [..., out, in] along the last axis.

    Per group of group_size inputs: w ~= scale * q + bias, q in [0, 2^bits - 1]; scale and bias
    are stored bf16 and q is computed against the stored (rounded) scale and bias. q is packed
    little-endian into uint32 words, element j of a word in bits [bits*j, bits*(j+1)).
    Returns (packed uint32 [..., out, in*bits/32], scales f32, biases f32), the latter two
    already bf16-rounded."""
    *lead, n_in = w.shape
    assert n_in % group_size == 0 and 32 % bits == 0
    g = w.reshape(*lead, n_in // group_size, group_size).astype(np.float32)
    n_bins = (1 << bits) - 1
    lo, hi = g.min(axis=-1), g.max(axis=-1)
    scale = bf16_round(np.maximum((hi - lo) / n_bins, np.float32(1e-8)))
    bias = bf16_round(lo)
    q = np.rint((g - bias[..., None]) / scale[..., None])
    q = np.clip(q, 0, n_bins).astype(np.uint32).reshape(*lead, n_in)
    per_word = 32 // bits
    q = q.reshape(*lead, n_in // per_word, per_word)
    shifts = (np.arange(per_word, dtype=np.uint32) * bits)
    packed = np.bitwise_or.reduce(q << shifts, axis=-1).astype(np.uint32)
    return packed, scale, bias


def dequantize(packed, scales, biases, group_size, bits):
    """Inverse of quantize (numpy), used by the self-check and by the reference script."""
    *lead, n_words = packed.shape
    per_word = 32 // bits
    shifts = np.arange(per_word, dtype=np.uint32) * bits
    q = (packed[..., None] >> shifts) & np.uint32((1 << bits) - 1)
    q = q.reshape(*lead, n_words * per_word).astype(np.float32)
    n_in = q.shape[-1]
    q = q.reshape(*lead, n_in // group_size, group_size)
    return (q * scales[..., None] + biases[..., None]).reshape(*lead, n_in)


HF_NORMS = (".input_layernorm.weight", ".post_attention_layernorm.weight", ".q_norm.weight",
            ".k_norm.weight")


def mlx_unquantized(master):
    """The MLX text weights before quantization: mlx-lm's names and conventions."""
    out = {}
    for k, v in master.items():
        if k == "lm_head.weight":
            out["language_model.lm_head.weight"] = v
            continue
        name = "language_model.model." + k
        if k.endswith("mlp.experts.gate_up_proj"):
            mid = v.shape[1] // 2
            base = name[: -len("experts.gate_up_proj")] + "switch_mlp."
            out[base + "gate_proj.weight"] = v[:, :mid, :]
            out[base + "up_proj.weight"] = v[:, mid:, :]
        elif k.endswith("mlp.experts.down_proj"):
            out[name[: -len("experts.down_proj")] + "switch_mlp.down_proj.weight"] = v
        elif k.endswith("conv1d.weight"):
            out[name] = np.ascontiguousarray(v.transpose(0, 2, 1))  # [C,1,K] -> [C,K,1]
        elif k.endswith(HF_NORMS) or k == "norm.weight":
            out[name] = bf16_round(v + np.float32(1.0))  # mlx-lm stores w_eff = 1 + w
        else:
            out[name] = v
    return out


def is_quantizable(name, v):
    """What mlx_lm.convert quantizes: every Linear / Embedding / SwitchLinear weight."""
    return name.endswith(".weight") and v.ndim in (2, 3) and "conv1d" not in name


def router_override(module):
    """mlx-lm's qwen3_5 quant_predicate: the router and shared-expert gate stay 8-bit."""
    if module.endswith("mlp.gate") or module.endswith("shared_expert_gate"):
        return {"group_size": 64, "bits": 8}
    return None


def write_mlx(outdir, master, seed, group_size, bits, extra_overrides, vision, with_index):
    os.makedirs(outdir, exist_ok=True)
    quant = {"group_size": group_size, "bits": bits, "mode": "affine"}
    tensors = {}
    for name, v in mlx_unquantized(master).items():
        if not is_quantizable(name, v):
            tensors[name] = f32(v) if name.endswith("A_log") else bf16(v)
            continue
        module = name[: -len(".weight")]
        ov = extra_overrides.get(module) or router_override(module)
        gs, b = (ov["group_size"], ov["bits"]) if ov else (group_size, bits)
        if ov:
            quant[module] = dict(ov)
        packed, scales, biases = quantize(v, gs, b)
        tensors[module + ".weight"] = u32(packed)
        tensors[module + ".scales"] = bf16(scales)
        tensors[module + ".biases"] = bf16(biases)
    if vision:
        name = "vision_tower.patch_embed.proj.weight"
        tensors[name] = bf16(centred(seed, name, (32, 2, 16, 16, 3), 0.02))

    fname = "model.safetensors"
    write_safetensors(os.path.join(outdir, fname), tensors, {"format": "mlx"})
    if with_index:
        write_index(os.path.join(outdir, "model.safetensors.index.json"), {fname: tensors})
    cfg = hf_config()
    if not vision:
        del cfg["vision_config"]  # mlx_lm.convert drops it; mlx-vlm keeps it
    quant = dict(sorted(quant.items()))
    cfg["quantization"] = quant
    cfg["quantization_config"] = quant
    write_json(os.path.join(outdir, "config.json"), dict(sorted(cfg.items())))


def self_check(master):
    """Quantization round trip stays within half a step per element."""
    w = master["layers.0.mlp.experts.down_proj"]
    for gs, b in ((64, 4), (32, 8), (128, 4), (64, 8)):
        p, s, bi = quantize(w, gs, b)
        err = np.abs(dequantize(p, s, bi, gs, b) - w).reshape(*w.shape[:-1], -1, gs).max(-1)
        if not np.all(err <= s + 1e-6):
            sys.exit(f"make_fixtures: quantization self-check failed (group {gs}, {b} bits)")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("outdir")
    ap.add_argument("--seed", type=int, default=SEED)
    args = ap.parse_args()
    os.makedirs(args.outdir, exist_ok=True)

    master = master_weights(args.seed)
    self_check(master)
    write_hf(os.path.join(args.outdir, "tiny-hf"), master, args.seed)
    write_mlx(os.path.join(args.outdir, "tiny-mlx4"), master, args.seed, 64, 4, {},
              vision=True, with_index=True)
    write_mlx(os.path.join(args.outdir, "tiny-mlx8"), master, args.seed, 32, 8,
              {"language_model.model.layers.0.linear_attn.out_proj": {"group_size": 128, "bits": 4}},
              vision=False, with_index=False)
    tokens = stream(args.seed, "tokens").integers(0, TEXT["vocab_size"], N_TOKENS).tolist()
    with open(os.path.join(args.outdir, "tokens.json"), "w") as f:
        json.dump(tokens, f)
        f.write("\n")


if __name__ == "__main__":
    main()
