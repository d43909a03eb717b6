"""wren tokenize / detokenize on bad and extreme input: clear errors, no crash.

Needs no reference library, so it also runs against the AddressSanitizer + UBSan build (the
"robust" prefix puts it in the sanitize label).
"""
import json
import os
import random
import subprocess

import pytest

SRC = os.environ.get("WREN_SRC", os.path.join(os.path.dirname(__file__), "..", ".."))
WREN = os.environ.get("WREN_BIN", os.path.join(SRC, "build", "wren"))
QWEN3 = os.path.join(SRC, "data", "tokenizers", "qwen3", "tokenizer.json")


def wren(*args, input=None):
    return subprocess.run([WREN, *args], input=input, capture_output=True, timeout=600)


def n_ids():
    with open(QWEN3, encoding="utf-8") as f:
        tj = json.load(f)
    return 1 + max(max(tj["model"]["vocab"].values()), max(a["id"] for a in tj["added_tokens"]))


@pytest.mark.parametrize("data", [b"abc\xff", b"\xc3", b"ok \xed\xa0\x80 surrogate", b"\xf8\x88\x80\x80\x80",
                                  b"\xc0\xaf overlong", b"\xf4\x90\x80\x80 too big"])
def test_invalid_utf8_is_an_error(tmp_path, data):
    p = tmp_path / "bad.txt"
    p.write_bytes(data)
    r = wren("tokenize", "-m", os.path.dirname(QWEN3), "--text-file", str(p))
    assert r.returncode == 1
    assert b"UTF-8" in r.stderr and r.stdout == b""


def test_cli_errors(tmp_path):
    d = os.path.dirname(QWEN3)
    r = wren("tokenize", "-m", str(tmp_path / "nope"), "x")
    assert r.returncode == 1 and b"nope" in r.stderr
    r = wren("tokenize", "x")
    assert r.returncode == 2 and b"-m" in r.stderr
    (tmp_path / "tokenizer.json").write_text("{not json")
    r = wren("tokenize", "-m", str(tmp_path), "x")
    assert r.returncode == 1 and b"not valid JSON" in r.stderr
    n = n_ids()
    r = wren("detokenize", "-m", d, "1", str(n))
    assert r.returncode == 1 and str(n).encode() in r.stderr and r.stdout == b""
    r = wren("detokenize", "-m", d, "12x")
    assert r.returncode == 1
    (tmp_path / "ids.json").write_text('{"a": 1}')
    r = wren("detokenize", "-m", d, "--ids-file", str(tmp_path / "ids.json"))
    assert r.returncode == 1 and b"JSON array" in r.stderr


def test_extreme_inputs(tmp_path):
    rng = random.Random(3)
    texts = {
        "spaces": " " * 200000,
        "letters": "a" * 200000,
        "cjk": "".join(chr(rng.randint(0x4E00, 0x9FFF)) for _ in range(50000)),
        "marks": "e" + "".join(chr(rng.randint(0x300, 0x36F)) for _ in range(50000)),
        "jamo": "".join(rng.choice("\u1100\u1161\u11a8") for _ in range(50000)),
        "whitespace": "".join(rng.choice(" \t\n\r\u3000\u00a0\u0085") for _ in range(100000)),
        "specials": "<|im_start|><think>" * 5000,
        "nul": "\x00" * 1000,
        "empty": "",
    }
    args = []
    for name, text in texts.items():
        p = tmp_path / name
        p.write_bytes(text.encode("utf-8"))
        args += ["--text-file", str(p)]
    r = wren("tokenize", "-m", os.path.dirname(QWEN3), *args)
    assert r.returncode == 0, r.stderr.decode()[-2000:]
    lines = r.stdout.decode().split("\n")[:-1]
    assert len(lines) == len(texts)
    for (name, text), line in zip(texts.items(), lines):
        ids = json.loads(line)
        assert (len(ids) > 0) == (len(text) > 0), name


def test_detokenize_any_ids(tmp_path):
    rng = random.Random(5)
    n = n_ids()
    args = []
    for i in range(200):
        p = tmp_path / f"ids{i}.json"
        p.write_text(json.dumps([rng.randrange(n) for _ in range(rng.randint(0, 50))]))
        args += ["--ids-file", str(p)]
    r = wren("detokenize", "-m", os.path.dirname(QWEN3), "--json", *args)
    assert r.returncode == 0, r.stderr.decode()[-2000:]
    lines = r.stdout.decode("utf-8").split("\n")[:-1]  # valid UTF-8, or decode() raises
    assert len(lines) == 200
    for line in lines:
        assert isinstance(json.loads(line), str)
