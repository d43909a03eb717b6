"""Bad input to `wren run` / `wren chat`: a clear message and exit status (2 for bad options,
1 for bad input found after parsing), never a crash. Also runs under ASan + UBSan (the name
starts with "robust"). WREN_TEST_MODEL=DIR uses an existing checkpoint instead of synthesizing.
"""
import os
import subprocess

import pytest

SRC = os.environ.get("WREN_SRC", os.path.join(os.path.dirname(__file__), "..", ".."))
WREN = os.environ.get("WREN_BIN", os.path.join(SRC, "build", "wren"))


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    if os.environ.get("WREN_TEST_MODEL"):
        return os.environ["WREN_TEST_MODEL"]
    out = tmp_path_factory.mktemp("robust") / "tiny"
    subprocess.run([WREN, "synth", "--preset", "tiny", "--tokenizer",
                    os.path.join(SRC, "data", "tokenizers", "qwen3"), "--out", str(out)],
                   check=True, capture_output=True, timeout=900)
    return str(out)


def wren(*args, stdin=b""):
    p = subprocess.run([WREN, *args], input=stdin, capture_output=True, timeout=900)
    return p.returncode, p.stderr.decode(errors="replace")


@pytest.mark.parametrize("args", [
    ["--top-p", "0"], ["--top-p", "1.5"], ["--temp", "-1"], ["--temp", "nan"],
    ["--max-tokens", "0"], ["--seed", "x"], ["--seed", "-3"], ["--min-p", "2"],
    ["--presence-penalty", "9"], ["--repetition-penalty", "0"], ["--stop", ""],
    ["--raw", "--no-think"], ["--raw", "--system", "s"], ["--bogus"], ["--max-tokens"],
    ["--messages", "m.json", "--system", "s"],
])
def test_bad_options(args):
    for cmd in ("run", "chat"):
        if cmd == "chat" and any(a in args for a in ("--raw", "--messages")):
            continue
        rc, err = wren(cmd, "-m", "nowhere", "-p", "x", *args) if cmd == "run" else \
            wren(cmd, "-m", "nowhere", *args)
        assert rc == 2 and err.startswith("wren"), (cmd, args, err)


def test_missing_model():
    rc, err = wren("run", "-m", "/nonexistent/model", "-p", "x")
    assert rc == 1 and "/nonexistent/model" in err
    rc, err = wren("chat", "-m", "/nonexistent/model")
    assert rc == 1 and "/nonexistent/model" in err
    rc, err = wren("run", "-p", "x")
    assert rc == 1 and "-m" in err


@pytest.mark.parametrize("text,needle", [
    ("{ not json", "m.json: invalid JSON"),
    ('{"role": "user"}', "m.json: expected a JSON array of messages"),
    ('[{"role": "user", "content": "a"}, {"role": "system", "content": "b"}]',
     "System message must be at the beginning"),
    ('[{"role": "wizard", "content": "a"}]', "No user query"),
    ('[{"role": "assistant", "content": "a"}]', "No user query"),
    ('[1, 2, 3]', "No user query"),
])
def test_bad_messages(model, tmp_path, text, needle):
    path = tmp_path / "m.json"
    path.write_text(text)
    rc, err = wren("run", "-m", model, "--backend", "cpu", "--messages", str(path))
    assert rc == 1 and err.startswith("wren run:") and needle in err, err


def test_context_overflow(model):
    rc, err = wren("run", "-m", model, "--backend", "cpu", "-p", "a long enough prompt",
                   "--ctx", "4")
    assert rc == 1 and "context" in err, err


def test_chat_survives_bad_turns(model):
    # An over-long message fails its turn; the chat goes on and answers the next one.
    lines = ("word " * 300 + "\nshort one\n").encode()
    p = subprocess.run([WREN, "chat", "-m", model, "--backend", "cpu", "--ctx", "128",
                        "--max-tokens", "4", "--temp", "0"], input=lines, capture_output=True,
                       timeout=900)
    err = p.stderr.decode(errors="replace")
    assert p.returncode == 0 and "context" in err
    assert err.count("reused") == 1, err
