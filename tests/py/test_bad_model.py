"""Malformed checkpoints must give a clear error naming the problem, exit status 1, and no crash.

Runs in the normal build and again under AddressSanitizer + UBSan (the name starts with "bad").
Each case copies the tiny MLX fixture, breaks one thing, and runs `wren logits` on it.
"""
import json
import os
import shutil
import struct
import subprocess
import sys

import pytest

SRC = os.environ.get("WREN_SRC", os.path.dirname(os.path.dirname(os.path.dirname(__file__))))
WREN = os.environ.get("WREN_BIN", os.path.join(SRC, "build", "wren"))


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    out = tmp_path_factory.mktemp("fixtures")
    subprocess.run([sys.executable, os.path.join(SRC, "tools", "make_fixtures.py"), str(out)],
                   check=True, capture_output=True)
    tokens = out / "short.json"
    tokens.write_text(json.dumps([1, 2, 3, 4, 5]))
    return out


def read_st(path):
    data = open(path, "rb").read()
    (n,) = struct.unpack("<Q", data[:8])
    return json.loads(data[8:8 + n]), data[8 + n:]


def write_st(path, header, body):
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    open(path, "wb").write(struct.pack("<Q", len(h)) + h + body)


def broken(base, tmp_path, name="tiny-mlx4"):
    d = tmp_path / name
    shutil.copytree(base / name, d)
    return d


def run_wren(model, base):
    p = subprocess.run([WREN, "logits", "-m", str(model), "--tokens-file", str(base / "short.json"),
                        "--out", os.devnull, "--backend", "cpu"], capture_output=True, text=True,
                       timeout=300)
    return p.returncode, p.stderr


def expect_error(model, base, *needles):
    rc, err = run_wren(model, base)
    assert rc == 1, f"expected exit 1 (clean error), got {rc}: {err}"
    for n in needles:
        assert n in err, f"error message lacks {n!r}: {err}"
    return err


def shard(d):
    return d / "model.safetensors"


def test_good_fixture_loads(base):
    rc, err = run_wren(base / "tiny-mlx4", base)
    assert rc == 0, err


def test_garbage_config(base, tmp_path):
    d = broken(base, tmp_path)
    (d / "config.json").write_text("{ this is not json")
    expect_error(d, base, "config.json", "not a valid JSON")


def test_config_missing_field(base, tmp_path):
    d = broken(base, tmp_path)
    cfg = json.loads((d / "config.json").read_text())
    del cfg["text_config"]["hidden_size"]
    (d / "config.json").write_text(json.dumps(cfg))
    expect_error(d, base, "hidden_size")


def test_config_wrong_type(base, tmp_path):
    d = broken(base, tmp_path)
    cfg = json.loads((d / "config.json").read_text())
    cfg["text_config"]["num_hidden_layers"] = "eight"
    (d / "config.json").write_text(json.dumps(cfg))
    expect_error(d, base, "num_hidden_layers")


def test_unsupported_model_type(base, tmp_path):
    d = broken(base, tmp_path)
    cfg = json.loads((d / "config.json").read_text())
    cfg["text_config"]["model_type"] = "llama"
    cfg["model_type"] = "llama"
    (d / "config.json").write_text(json.dumps(cfg))
    expect_error(d, base, "llama", "not supported")


def test_truncated_safetensors(base, tmp_path):
    d = broken(base, tmp_path)
    data = shard(d).read_bytes()
    shard(d).write_bytes(data[: len(data) // 2])
    expect_error(d, base, "model.safetensors", "past the end")


def test_header_length_past_end(base, tmp_path):
    d = broken(base, tmp_path)
    data = bytearray(shard(d).read_bytes())
    data[:8] = struct.pack("<Q", len(data) * 4)
    shard(d).write_bytes(bytes(data))
    expect_error(d, base, "header length")


def test_header_not_json(base, tmp_path):
    d = broken(base, tmp_path)
    data = bytearray(shard(d).read_bytes())
    data[8:16] = b"\x00\xff{{{{{{"
    shard(d).write_bytes(bytes(data))
    expect_error(d, base, "not a valid JSON")


def test_tiny_file(base, tmp_path):
    d = broken(base, tmp_path)
    shard(d).write_bytes(b"\x01\x02")
    expect_error(d, base, "too small")


def test_offsets_past_end(base, tmp_path):
    d = broken(base, tmp_path)
    header, body = read_st(shard(d))
    name = next(k for k in header if k.endswith("embed_tokens.weight"))
    a, b = header[name]["data_offsets"]
    header[name]["data_offsets"] = [a, len(body) + 4096]
    write_st(shard(d), header, body)
    expect_error(d, base, name)


def test_wrong_shape(base, tmp_path):
    d = broken(base, tmp_path)
    header, body = read_st(shard(d))
    name = next(k for k in header if k.endswith("layers.0.linear_attn.in_proj_z.scales"))
    s = header[name]["shape"]
    header[name]["shape"] = [s[1], s[0]]  # same byte size, transposed
    write_st(shard(d), header, body)
    err = expect_error(d, base, name, "expected", "found")
    assert str(s[1]) in err


def test_missing_tensor(base, tmp_path):
    d = broken(base, tmp_path)
    header, body = read_st(shard(d))
    name = next(k for k in header if k.endswith("layers.3.self_attn.k_norm.weight"))
    del header[name]
    write_st(shard(d), header, body)
    expect_error(d, base, "missing tensor", name)


def test_unknown_dtype(base, tmp_path):
    d = broken(base, tmp_path)
    header, body = read_st(shard(d))
    name = next(k for k in header if k.endswith("layers.1.linear_attn.out_proj.weight"))
    header[name]["dtype"] = "F8_E4M3"
    write_st(shard(d), header, body)
    expect_error(d, base, name, "F8_E4M3")


def test_unexpected_tensor(base, tmp_path):
    d = broken(base, tmp_path)
    header, body = read_st(shard(d))
    header["language_model.model.layers.0.mystery.weight"] = {
        "dtype": "BF16", "shape": [2], "data_offsets": [0, 4]}
    write_st(shard(d), header, body)
    expect_error(d, base, "unexpected tensor", "mystery")


def test_bad_token_ids(base, tmp_path):
    toks = tmp_path / "t.json"
    toks.write_text(json.dumps([1, 2, 99999999]))
    p = subprocess.run([WREN, "logits", "-m", str(base / "tiny-mlx4"), "--tokens-file", str(toks),
                        "--out", os.devnull, "--backend", "cpu"], capture_output=True, text=True)
    assert p.returncode == 1 and "out of range" in p.stderr
    toks.write_text("[1, 2,")
    p = subprocess.run([WREN, "logits", "-m", str(base / "tiny-mlx4"), "--tokens-file", str(toks),
                        "--out", os.devnull, "--backend", "cpu"], capture_output=True, text=True)
    assert p.returncode == 1 and "JSON array" in p.stderr


def test_missing_directory(base, tmp_path):
    expect_error(tmp_path / "nope", base, "config.json")
