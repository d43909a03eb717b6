"""wren synth: checks the written checkpoints with independent readers.

The safetensors package (pinned) parses every file; the header layout is also checked byte by byte
against the format spec. The expected tensor table is derived here from the config and the layout
described in shared docs/MODEL.md (mlx-community Qwen3.6-35B-A3B-4bit), not from wren's code.
"""

import json
import os
import resource
import signal
import struct
import subprocess
from pathlib import Path

import numpy as np
import pytest
import safetensors
from tokenizers import Tokenizer

SRC = Path(os.environ.get("WREN_SRC", Path(__file__).resolve().parents[2]))
BIN = os.environ.get("WREN_BIN", str(SRC / "build" / "wren"))
TOKENIZER = SRC / "data" / "tokenizers" / "qwen3"


def synth(out, *args, check=True, **kw):
    r = subprocess.run([BIN, "synth", "--out", str(out), *args], capture_output=True, text=True,
                       timeout=300, **kw)
    if check:
        assert r.returncode == 0, r.stderr
    return r


# ---------------------------------------------------------------- expected layout (from MODEL.md)

def expected_tensors(cfg, vision=False):
    """name -> (dtype, shape) of an MLX affine-quantized Qwen3.5/3.6 MoE checkpoint."""
    tc, q = cfg["text_config"], cfg["quantization"]
    H, V, L = tc["hidden_size"], tc["vocab_size"], tc["num_hidden_layers"]
    gs = q["group_size"]
    exp = {}

    def quant(path, out, inn, lead=()):
        bits = q.get(path, {}).get("bits", q["bits"])
        exp[path + ".weight"] = ("U32", [*lead, out, inn * bits // 32])
        exp[path + ".scales"] = ("BF16", [*lead, out, inn // gs])
        exp[path + ".biases"] = ("BF16", [*lead, out, inn // gs])

    m = "language_model.model"
    quant(f"{m}.embed_tokens", V, H)
    quant("language_model.lm_head", V, H)
    exp[f"{m}.norm.weight"] = ("BF16", [H])
    kd, vd = tc["linear_num_key_heads"] * tc["linear_key_head_dim"], \
        tc["linear_num_value_heads"] * tc["linear_value_head_dim"]
    nv, hd = tc["linear_num_value_heads"], tc["head_dim"]
    E, I, S = tc["num_experts"], tc["moe_intermediate_size"], tc["shared_expert_intermediate_size"]
    for i, kind in enumerate(tc["layer_types"]):
        p = f"{m}.layers.{i}"
        exp[f"{p}.input_layernorm.weight"] = ("BF16", [H])
        exp[f"{p}.post_attention_layernorm.weight"] = ("BF16", [H])
        if kind == "linear_attention":
            a = f"{p}.linear_attn"
            quant(f"{a}.in_proj_qkv", 2 * kd + vd, H)
            quant(f"{a}.in_proj_z", vd, H)
            quant(f"{a}.in_proj_b", nv, H)
            quant(f"{a}.in_proj_a", nv, H)
            quant(f"{a}.out_proj", H, vd)
            exp[f"{a}.conv1d.weight"] = ("BF16", [2 * kd + vd, tc["linear_conv_kernel_dim"], 1])
            exp[f"{a}.A_log"] = ("F32", [nv])
            exp[f"{a}.dt_bias"] = ("BF16", [nv])
            exp[f"{a}.norm.weight"] = ("BF16", [tc["linear_value_head_dim"]])
        else:
            a = f"{p}.self_attn"
            nh, nkv = tc["num_attention_heads"], tc["num_key_value_heads"]
            quant(f"{a}.q_proj", nh * hd * 2, H)  # query and output gate
            quant(f"{a}.k_proj", nkv * hd, H)
            quant(f"{a}.v_proj", nkv * hd, H)
            quant(f"{a}.o_proj", H, nh * hd)
            exp[f"{a}.q_norm.weight"] = ("BF16", [hd])
            exp[f"{a}.k_norm.weight"] = ("BF16", [hd])
        quant(f"{p}.mlp.gate", E, H)
        quant(f"{p}.mlp.switch_mlp.gate_proj", I, H, (E,))
        quant(f"{p}.mlp.switch_mlp.up_proj", I, H, (E,))
        quant(f"{p}.mlp.switch_mlp.down_proj", H, I, (E,))
        quant(f"{p}.mlp.shared_expert.gate_proj", S, H)
        quant(f"{p}.mlp.shared_expert.up_proj", S, H)
        quant(f"{p}.mlp.shared_expert.down_proj", H, S)
        quant(f"{p}.mlp.shared_expert_gate", 1, H)
    if vision:  # mlx-vlm names, unquantized bf16
        vc, vt = cfg["vision_config"], "vision_tower"
        VH, VI = vc["hidden_size"], vc["intermediate_size"]
        M = VH * vc["spatial_merge_size"] ** 2
        exp[f"{vt}.patch_embed.proj.weight"] = (
            "BF16", [VH, vc["temporal_patch_size"], vc["patch_size"], vc["patch_size"],
                     vc["in_channels"]])
        exp[f"{vt}.patch_embed.proj.bias"] = ("BF16", [VH])
        exp[f"{vt}.pos_embed.weight"] = ("BF16", [vc["num_position_embeddings"], VH])
        for b in range(vc["depth"]):
            p = f"{vt}.blocks.{b}"
            for n in ("norm1", "norm2"):
                exp[f"{p}.{n}.weight"] = exp[f"{p}.{n}.bias"] = ("BF16", [VH])
            for n, o, i in (("attn.qkv", 3 * VH, VH), ("attn.proj", VH, VH),
                            ("mlp.linear_fc1", VI, VH), ("mlp.linear_fc2", VH, VI)):
                exp[f"{p}.{n}.weight"] = ("BF16", [o, i])
                exp[f"{p}.{n}.bias"] = ("BF16", [o])
        exp[f"{vt}.merger.norm.weight"] = exp[f"{vt}.merger.norm.bias"] = ("BF16", [VH])
        exp[f"{vt}.merger.linear_fc1.weight"] = ("BF16", [M, M])
        exp[f"{vt}.merger.linear_fc1.bias"] = ("BF16", [M])
        exp[f"{vt}.merger.linear_fc2.weight"] = ("BF16", [vc["out_hidden_size"], M])
        exp[f"{vt}.merger.linear_fc2.bias"] = ("BF16", [vc["out_hidden_size"]])
    return exp


# ---------------------------------------------------------------- reading what was written

def read_checkpoint(d):
    """Parses every shard with safetensors and checks the spec layout; returns name -> tensor."""
    d = Path(d)
    index = json.loads((d / "model.safetensors.index.json").read_text())
    files = sorted(set(index["weight_map"].values()))
    assert sorted(p.name for p in d.glob("*.safetensors")) == files
    tensors = {}
    for f in files:
        raw = (d / f).read_bytes()
        hlen = struct.unpack("<Q", raw[:8])[0]
        assert hlen % 8 == 0, "header must be padded to a multiple of 8"
        header_text = raw[8:8 + hlen].decode("utf-8")
        assert header_text == header_text.rstrip(" ") + " " * (len(header_text) -
                                                                len(header_text.rstrip(" ")))
        header = json.loads(header_text)  # header order is preserved by json (dict)
        assert header.pop("__metadata__") == {"format": "mlx"}
        at = 0  # tensors contiguous in header order, covering the whole data section
        for name, h in header.items():
            assert h["data_offsets"][0] == at, name
            at = h["data_offsets"][1]
        assert 8 + hlen + at == len(raw)
        parsed = safetensors.deserialize(raw)  # the independent reader
        assert {n for n, _ in parsed} == set(header)
        for name, t in parsed:
            assert name not in tensors, f"{name} in two files"
            assert index["weight_map"][name] == f
            assert header[name]["dtype"] == t["dtype"] and header[name]["shape"] == t["shape"]
            tensors[name] = t
    assert set(index["weight_map"]) == set(tensors)
    assert index["metadata"]["total_size"] == sum(len(t["data"]) for t in tensors.values())
    return index, tensors


def values(t):
    data = t["data"]
    if t["dtype"] == "BF16":
        a = (np.frombuffer(data, np.uint16).astype(np.uint32) << 16).view(np.float32)
    elif t["dtype"] == "F32":
        a = np.frombuffer(data, np.float32)
    else:
        a = np.frombuffer(data, np.uint32)
    return a.reshape(t["shape"])


def dequantize(tensors, base, bits, group):
    w = values(tensors[base + ".weight"])
    per = 32 // bits
    shifts = np.arange(per, dtype=np.uint32) * bits
    codes = (w[..., None] >> shifts) & ((1 << bits) - 1)  # lowest bits first
    codes = codes.reshape(*w.shape[:-1], w.shape[-1] * per).astype(np.float32)
    s = np.repeat(values(tensors[base + ".scales"]), group, axis=-1)
    b = np.repeat(values(tensors[base + ".biases"]), group, axis=-1)
    return codes * s + b


def check_values(cfg, tensors):
    q = cfg["quantization"]
    for name in tensors:
        if not name.endswith(".scales"):
            continue
        base = name[: -len(".scales")]
        bits = q.get(base, {}).get("bits", q["bits"])
        w = dequantize(tensors, base, bits, q["group_size"])
        assert np.isfinite(w).all(), base
        target = 1 / np.sqrt(w.shape[-1])  # std = 1/sqrt(in_features)
        groups = w.size // q["group_size"]
        tol = 0.03 + 0.5 / np.sqrt(groups)
        assert abs(w.std() / target - 1) < tol, (base, w.std(), target)
        assert abs(w.mean()) < 0.1 * target + 2 * target / np.sqrt(groups), base
        rows = w.reshape(-1, w.shape[-1])
        assert (rows.std(axis=1) > 0).all(), f"{base} has a constant row"
    for name, t in tensors.items():
        if name.endswith((".weight", ".scales", ".biases")) and t["dtype"] == "U32":
            continue
        v = values(t).astype(np.float64)
        assert np.isfinite(v).all(), name
        if name.endswith(("layernorm.weight", "norm.weight")) and "vision" not in name:
            assert 0.94 <= v.min() and v.max() <= 1.06, name  # effective weights ~ 1
            assert abs(v.mean() - 1) < 0.02, name
        elif name.endswith("A_log"):
            assert t["dtype"] == "F32"
            assert 1 - 1e-4 <= np.exp(v).min() and np.exp(v).max() <= 16 + 1e-3, name
        elif name.endswith("dt_bias"):
            assert np.abs(v).max() <= 0.5 + 1e-3, name
        elif name.endswith("conv1d.weight"):
            assert abs(v.std() / (1 / np.sqrt(v.shape[1])) - 1) < 0.05, name


def check_config(cfg, layers, vocab):
    assert cfg["architectures"] == ["Qwen3_5MoeForConditionalGeneration"]
    assert cfg["model_type"] == "qwen3_5_moe"
    q = cfg["quantization"]
    assert cfg["quantization_config"] == q
    assert (q["group_size"], q["bits"], q["mode"]) == (64, 4, "affine")
    overrides = {k: v for k, v in q.items() if isinstance(v, dict)}
    want = {f"language_model.model.layers.{i}.{m}": {"group_size": 64, "bits": 8}
            for i in range(layers) for m in ("mlp.gate", "mlp.shared_expert_gate")}
    assert overrides == want
    tc = cfg["text_config"]
    assert tc["model_type"] == "qwen3_5_moe_text"
    assert tc["num_hidden_layers"] == layers and tc["vocab_size"] == vocab
    assert tc["layer_types"] == ["full_attention" if (i + 1) % 4 == 0 else "linear_attention"
                                 for i in range(layers)]
    assert tc["rope_parameters"]["rope_theta"] == 1e7
    assert tc["rope_parameters"]["partial_rotary_factor"] == 0.25
    assert tc["rms_norm_eps"] == 1e-6 and tc["tie_word_embeddings"] is False
    assert "vision_config" in cfg


TINY = dict(hidden_size=256, num_attention_heads=4, num_key_value_heads=2, head_dim=256,
            linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=128,
            linear_value_head_dim=128, num_experts=16, num_experts_per_tok=4,
            moe_intermediate_size=128, shared_expert_intermediate_size=128)


# ---------------------------------------------------------------- tests

@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    out = tmp_path_factory.mktemp("tiny") / "ckpt"
    synth(out, "--preset", "tiny", "--seed", "7")
    return out


def test_tiny_layout_and_values(tiny):
    cfg = json.loads((tiny / "config.json").read_text())
    check_config(cfg, 8, 1024)
    for k, v in TINY.items():
        assert cfg["text_config"][k] == v, k
    index, tensors = read_checkpoint(tiny)
    exp = expected_tensors(cfg)
    assert set(tensors) == set(exp)
    for name, (dtype, shape) in exp.items():
        assert (tensors[name]["dtype"], tensors[name]["shape"]) == (dtype, shape), name
    assert list(index["weight_map"]) == sorted(index["weight_map"])
    assert (tiny / "model.safetensors").exists()  # one file: mlx-lm's single-shard name
    check_values(cfg, tensors)
    gen = json.loads((tiny / "generation_config.json").read_text())
    assert gen["eos_token_id"] == [cfg["text_config"]["eos_token_id"] + 2,
                                   cfg["text_config"]["eos_token_id"]]
    assert (gen["temperature"], gen["top_k"], gen["top_p"]) == (1.0, 20, 0.95)


def test_router_rows_spread_over_experts(tiny):
    cfg = json.loads((tiny / "config.json").read_text())
    _, tensors = read_checkpoint(tiny)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((512, cfg["text_config"]["hidden_size"])).astype(np.float32)
    k = cfg["text_config"]["num_experts_per_tok"]
    for i in range(cfg["text_config"]["num_hidden_layers"]):
        g = dequantize(tensors, f"language_model.model.layers.{i}.mlp.gate", 8, 64)
        top = np.argsort(-(x @ g.T), axis=1)[:, :k]
        counts = np.bincount(top.ravel(), minlength=g.shape[0])
        assert (counts > 0).all(), f"layer {i}: an expert is never chosen"
        assert counts.max() < 4 * counts.mean(), f"layer {i}: routing collapses"


def test_layers_override_keeps_pattern(tmp_path):
    out = tmp_path / "l4"
    synth(out, "--preset", "tiny", "--layers", "4")
    cfg = json.loads((out / "config.json").read_text())
    check_config(cfg, 4, 1024)
    _, tensors = read_checkpoint(out)
    exp = expected_tensors(cfg)
    assert {n: (t["dtype"], t["shape"]) for n, t in tensors.items()} == \
        {n: (d, s) for n, (d, s) in exp.items()}


def test_tokenizer_sizes_vocab_and_ids(tmp_path):
    out = tmp_path / "tok"
    synth(out, "--preset", "tiny", "--tokenizer", str(TOKENIZER))
    tok = Tokenizer.from_file(str(TOKENIZER / "tokenizer.json"))
    n = tok.get_vocab_size(with_added_tokens=True)
    vocab = (n + 63) // 64 * 64
    cfg = json.loads((out / "config.json").read_text())
    check_config(cfg, 8, vocab)
    eot, im_end = tok.token_to_id("<|endoftext|>"), tok.token_to_id("<|im_end|>")
    assert cfg["text_config"]["eos_token_id"] == eot
    gen = json.loads((out / "generation_config.json").read_text())
    assert gen["eos_token_id"] == [im_end, eot]
    for f in ("tokenizer.json", "tokenizer_config.json"):
        assert (out / f).read_bytes() == (TOKENIZER / f).read_bytes()
    _, tensors = read_checkpoint(out)
    assert tensors["language_model.model.embed_tokens.weight"]["shape"][0] == vocab
    assert tensors["language_model.lm_head.scales"]["shape"][0] == vocab
    assert vocab >= n and vocab % 64 == 0


def test_tokenizer_generation_config_is_copied(tmp_path):
    src = tmp_path / "tok"
    src.mkdir()
    for f in ("tokenizer.json", "tokenizer_config.json"):
        (src / f).write_bytes((TOKENIZER / f).read_bytes())
    (src / "generation_config.json").write_text('{"eos_token_id": [1, 2], "top_k": 5}\n')
    (src / "chat_template.jinja").write_text("{{ messages }}")
    out = tmp_path / "out"
    synth(out, "--preset", "tiny", "--tokenizer", str(src))
    for f in ("generation_config.json", "chat_template.jinja"):
        assert (out / f).read_bytes() == (src / f).read_bytes()


def test_same_seed_same_bytes_other_seed_differs(tmp_path, tiny):
    a, b, c = tmp_path / "a", tmp_path / "b", tmp_path / "c"
    synth(a, "--preset", "tiny", "--seed", "7", "--threads", "1")
    synth(b, "--preset", "tiny", "--seed", "7", "--threads", "3")
    synth(c, "--preset", "tiny", "--seed", "8")
    for f in sorted(p.name for p in tiny.iterdir()):
        assert (a / f).read_bytes() == (tiny / f).read_bytes(), f
        assert (b / f).read_bytes() == (tiny / f).read_bytes(), f
    assert (c / "config.json").read_bytes() == (a / "config.json").read_bytes()
    _, ta = read_checkpoint(a)
    _, tc = read_checkpoint(c)
    differ = [n for n in ta if ta[n]["data"] != tc[n]["data"]]
    assert len(differ) == len(ta), "every tensor must change with the seed"


def test_sharding_like_mlx(tmp_path):
    out = tmp_path / "sh"
    synth(out, "--preset", "tiny", "--shard-mb", "2")
    index, tensors = read_checkpoint(out)
    files = sorted(set(index["weight_map"].values()))
    n = len(files)
    assert n > 2
    assert files == [f"model-{i:05d}-of-{n:05d}.safetensors" for i in range(1, n + 1)]
    cap = 2 << 20
    for f in files:
        size = sum(len(t["data"]) for name, t in tensors.items() if index["weight_map"][name] == f)
        assert size <= cap
    cfg = json.loads((out / "config.json").read_text())
    assert set(tensors) == set(expected_tensors(cfg))


def test_vision_tower(tmp_path):
    out = tmp_path / "vis"
    synth(out, "--preset", "tiny", "--vision", "--layers", "4")
    cfg = json.loads((out / "config.json").read_text())
    _, tensors = read_checkpoint(out)
    exp = expected_tensors(cfg, vision=True)
    assert {n: (t["dtype"], t["shape"]) for n, t in tensors.items()} == \
        {n: (d, s) for n, (d, s) in exp.items()}
    w = values(tensors["vision_tower.blocks.0.mlp.linear_fc2.weight"])
    assert abs(w.std() * np.sqrt(w.shape[1]) - 1) < 0.05


def published_config(layers=40):
    """The config of mlx-community/Qwen3.6-35B-A3B-4bit as MODEL.md describes it."""
    q = {"group_size": 64, "bits": 4, "mode": "affine"}
    for i in range(layers):
        for m in ("mlp.gate", "mlp.shared_expert_gate"):
            q[f"language_model.model.layers.{i}.{m}"] = {"group_size": 64, "bits": 8}
    return {
        "quantization": q,
        "text_config": dict(
            hidden_size=2048, num_hidden_layers=layers, vocab_size=248320,
            num_attention_heads=16, num_key_value_heads=2, head_dim=256,
            linear_num_key_heads=16, linear_num_value_heads=32, linear_key_head_dim=128,
            linear_value_head_dim=128, linear_conv_kernel_dim=4, num_experts=256,
            num_experts_per_tok=8, moe_intermediate_size=512, shared_expert_intermediate_size=512,
            layer_types=["full_attention" if (i + 1) % 4 == 0 else "linear_attention"
                         for i in range(layers)]),
        "vision_config": dict(depth=27, hidden_size=1152, intermediate_size=4304, num_heads=16,
                              out_hidden_size=2048, num_position_embeddings=2304, patch_size=16,
                              temporal_patch_size=2, spatial_merge_size=2, in_channels=3),
    }


def test_full_preset_plan_is_the_published_one():
    # The real dimensions without writing 20 GB: --plan prints the table the writer uses.
    r = subprocess.run([BIN, "synth", "--preset", "qwen3.6-35b-a3b", "--plan"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    plan = json.loads(r.stdout)
    exp = expected_tensors(published_config(), vision=True)
    got = {n: (t["dtype"], t["shape"]) for n, t in plan["tensors"].items()}
    assert got == {n: (d, s) for n, (d, s) in exp.items()}
    assert len(got) == 2090  # as published: 1757 language + 333 vision tensors
    assert plan["files"] == 4
    files = [t["file"] for t in plan["tensors"].values()]
    assert files == sorted(files)  # file order
    sizes = {}
    for n, t in plan["tensors"].items():
        nbytes = np.prod(t["shape"]) * (2 if t["dtype"] == "BF16" else 4)
        sizes[t["file"]] = sizes.get(t["file"], 0) + nbytes
    assert max(sizes.values()) <= 5 << 30 and sum(sizes.values()) == plan["total_size"]
    sw = got["language_model.model.layers.0.mlp.switch_mlp.gate_proj.weight"]
    assert sw == ("U32", [256, 512, 256])
    assert got["language_model.model.layers.0.mlp.gate.weight"] == ("U32", [256, 512])  # 8-bit
    assert got["language_model.model.layers.0.linear_attn.conv1d.weight"] == \
        ("BF16", [8192, 4, 1])
    assert got["language_model.model.layers.0.linear_attn.A_log"] == ("F32", [32])
    cfg = plan["config"]  # the config.json this run would write
    check_config(cfg, 40, 248320)
    tc = cfg["text_config"]
    for k, v in published_config()["text_config"].items():
        assert tc[k] == v, k
    for k, v in published_config()["vision_config"].items():
        assert cfg["vision_config"][k] == v, k
    assert tc["max_position_embeddings"] == 262144 and tc["eos_token_id"] == 248044
    assert tc["partial_rotary_factor"] == 0.25 and tc["mamba_ssm_dtype"] == "float32"


# ---------------------------------------------------------------- errors

def test_bad_preset(tmp_path):
    r = synth(tmp_path / "x", "--preset", "huge", check=False)
    assert r.returncode != 0 and "preset" in r.stderr
    assert not (tmp_path / "x").exists()


def test_refuses_non_empty_dir_unless_forced(tmp_path, tiny):
    out = tmp_path / "busy"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    r = synth(out, "--preset", "tiny", check=False)
    assert r.returncode != 0 and "not empty" in r.stderr and "--force" in r.stderr
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt"]
    (out / "model-00001-of-00009.safetensors").write_text("stale")
    synth(out, "--preset", "tiny", "--seed", "7", "--force")
    assert (out / "notes.txt").read_text() == "mine"
    assert not (out / "model-00001-of-00009.safetensors").exists()
    assert (out / "model.safetensors").read_bytes() == (tiny / "model.safetensors").read_bytes()


def test_unwritable_destination(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    r = synth(blocker / "sub", "--preset", "tiny", check=False)
    assert r.returncode != 0 and "sub" in r.stderr


def test_write_failure_is_reported_and_cleaned_up(tmp_path):
    # A file-size limit makes the shard write fail like a full disk would.
    out = tmp_path / "full"

    def limit():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, 1 << 20))

    r = synth(out, "--preset", "tiny", check=False, preexec_fn=limit)
    assert r.returncode != 0
    assert "model.safetensors" in r.stderr
    assert not (out / "model.safetensors").exists(), "partial shard left behind"
    assert not (out / "model.safetensors.index.json").exists()


def test_bad_tokenizer_dir_writes_nothing(tmp_path):
    src = tmp_path / "half"
    src.mkdir()
    (src / "tokenizer.json").write_bytes((TOKENIZER / "tokenizer.json").read_bytes())
    r = synth(tmp_path / "o", "--preset", "tiny", "--tokenizer", str(src), check=False)
    assert r.returncode != 0 and "tokenizer_config.json" in r.stderr
    assert not (tmp_path / "o").exists()
    (src / "tokenizer_config.json").write_text("{}")
    (src / "tokenizer.json").write_text('{"model": {"vocab": {"a": 0}}, "added_tokens": []}')
    r = synth(tmp_path / "o", "--preset", "tiny", "--tokenizer", str(src), check=False)
    assert r.returncode != 0 and "<|endoftext|>" in r.stderr
    (src / "tokenizer.json").write_text('{"model": ')
    r = synth(tmp_path / "o", "--preset", "tiny", "--tokenizer", str(src), check=False)
    assert r.returncode != 0 and "JSON" in r.stderr


def test_bad_options(tmp_path):
    for args in (["--preset", "tiny", "--layers", "0"], ["--preset", "tiny", "--seed", "-1"],
                 ["--preset", "tiny", "--bogus"], ["--preset"],
                 ["--preset", "tiny", "--threads", "x"]):
        r = synth(tmp_path / "o", *args, check=False)
        assert r.returncode != 0, args
    r = subprocess.run([BIN, "synth", "--preset", "tiny"], capture_output=True, text=True)
    assert r.returncode != 0 and "--out" in r.stderr
