"""End to end: `wren run` and `wren chat` on a tiny random-weight model with the real Qwen3
tokenizer (made by `wren synth`). Random weights give gibberish, but deterministic gibberish, so
the checks are about the machinery: determinism, limits, stop strings, the prompt the template
produces (checked against jinja2 + HF tokenizers) and exact state reuse across chat turns.

WREN_TEST_MODEL=DIR uses an existing checkpoint instead of synthesizing one.
"""
import json
import os
import re
import subprocess

import pytest
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Tokenizer

SRC = os.environ.get("WREN_SRC", os.path.join(os.path.dirname(__file__), "..", ".."))
WREN = os.environ.get("WREN_BIN", os.path.join(SRC, "build", "wren"))
TOKENIZER = os.path.join(SRC, "data", "tokenizers", "qwen3")


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    if os.environ.get("WREN_TEST_MODEL"):
        return os.environ["WREN_TEST_MODEL"]
    out = tmp_path_factory.mktemp("gen") / "tiny"
    subprocess.run([WREN, "synth", "--preset", "tiny", "--tokenizer", TOKENIZER, "--out", str(out)],
                   check=True, capture_output=True, timeout=600)
    return str(out)


@pytest.fixture(scope="module")
def hf_tok():
    return Tokenizer.from_file(os.path.join(TOKENIZER, "tokenizer.json"))


def template():
    """The official Qwen3.6 template in HF's jinja environment."""
    def raise_exception(msg):
        raise ValueError(msg)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = lambda x, **kw: json.dumps(x, ensure_ascii=False)
    env.globals["raise_exception"] = raise_exception
    with open(os.path.join(SRC, "data", "chat_templates", "qwen3.6.jinja"), encoding="utf-8") as f:
        return env.from_string(f.read())


def wren(cmd, model, *args, stdin=None, tmp_path=None, log=True):
    """Runs wren CMD; returns (stdout, stderr, log records)."""
    argv = [WREN, cmd, "-m", model, "--backend", "cpu", *args]
    log_path = None
    if log:
        log_path = os.path.join(str(tmp_path), f"log{len(os.listdir(str(tmp_path)))}.jsonl")
        argv += ["--log", log_path]
    p = subprocess.run(argv, input=stdin, capture_output=True, timeout=600)
    assert p.returncode == 0, p.stderr.decode(errors="replace")
    records = []
    if log_path:
        with open(log_path, encoding="utf-8") as f:
            records = [json.loads(line) for line in f]
    return p.stdout.decode(), p.stderr.decode(), records


GREEDY = ["--temp", "0", "--max-tokens", "24"]


def test_run_greedy_is_deterministic(model, tmp_path, hf_tok):
    a_out, a_err, [a] = wren("run", model, "-p", "Tell me a story.", *GREEDY, tmp_path=tmp_path)
    b_out, _, [b] = wren("run", model, "-p", "Tell me a story.", *GREEDY, tmp_path=tmp_path)
    assert a["generated"] == b["generated"] and a_out == b_out
    assert 0 < len(a["generated"]) <= 24
    assert all(0 <= t < hf_tok.get_vocab_size(with_added_tokens=True) for t in a["generated"])
    assert re.search(r"\[prompt \d+ tokens, prefill [\d.]+ tok/s \| generated \d+ tokens, "
                     r"decode [\d.]+ tok/s\]", a_err)
    # The printed text is the generated tokens' text, split into reasoning and content.
    assert a_out == a["content"] + "\n"


def test_seed_determinism(model, tmp_path):
    args = ["-p", "Write a poem.", "--temp", "1.0", "--top-k", "100", "--max-tokens", "24"]
    _, _, [a] = wren("run", model, *args, "--seed", "7", tmp_path=tmp_path)
    _, _, [b] = wren("run", model, *args, "--seed", "7", tmp_path=tmp_path)
    _, _, [c] = wren("run", model, *args, "--seed", "8", tmp_path=tmp_path)
    assert a["generated"] == b["generated"]
    assert a["generated"] != c["generated"]


def test_max_tokens(model, tmp_path):
    for n in (1, 5):
        _, err, [r] = wren("run", model, "-p", "Count.", "--temp", "0", "--max-tokens", str(n),
                           tmp_path=tmp_path)
        assert len(r["generated"]) == n and r["finish"] == "length"
        assert f"generated {n} tokens" in err


def test_stop_string(model, tmp_path):
    raw = ["--raw", "-p", "Once upon a time", "--temp", "0", "--max-tokens", "40"]
    full, _, [r] = wren("run", model, *raw, tmp_path=tmp_path)
    text = full[:-1]  # run ends the reply with a newline
    assert text == r["content"] and len(text) > 12
    # A stop string from the middle of the reply: the output is what came before it.
    stop = text[8:12]
    cut, _, [s] = wren("run", model, *raw, f"--stop={stop}", tmp_path=tmp_path)
    assert cut[:-1] == text[:text.index(stop)]
    assert s["finish"] == "stop" and len(s["generated"]) < len(r["generated"])
    assert s["generated"] == r["generated"][:len(s["generated"])]
    # A stop string that never occurs changes nothing.
    same, _, _ = wren("run", model, *raw, "--stop", "\x01never\x01", tmp_path=tmp_path)
    assert same == full


def test_prompt_matches_template(model, tmp_path, hf_tok):
    tpl = template()
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"}]
    for think in (True, False):
        args = ["--system", "Be brief.", "-p", "Hi there", "--max-tokens", "2", "--temp", "0"]
        _, _, [r] = wren("run", model, *args, *([] if think else ["--no-think"]),
                         tmp_path=tmp_path)
        text = hf_tok.decode(r["prompt"], skip_special_tokens=False)
        assert text.endswith("<think>\n" if think else "<think>\n\n</think>\n\n")
        want = tpl.render(messages=msgs, add_generation_prompt=True, enable_thinking=think)
        assert r["prompt"] == hf_tok.encode(want, add_special_tokens=False).ids


def chat_turns(model, tmp_path, lines, *args):
    out, err, recs = wren("chat", model, "--temp", "0", "--max-tokens", "16", *args,
                          stdin="\n".join(lines).encode() + b"\n", tmp_path=tmp_path)
    summaries = re.findall(r"prefilled (\d+) new tokens, (\d+) reused", err)
    return out, [(int(a), int(b)) for a, b in summaries], recs


def test_chat_reuses_state_exactly(model, tmp_path, hf_tok):
    lines = ["Hello, who are you?", "/think off", "What is the capital of France?",
             "/think on", "And of Italy?"]
    _, summaries, recs = chat_turns(model, tmp_path, lines)
    assert len(summaries) == 3 and len(recs) == 3
    assert summaries[0][1] == 0
    for (fresh, reused), r in zip(summaries, recs):
        assert fresh + reused == len(r["prompt"]) and reused == r["reused"]
    assert summaries[1][1] > 0 and summaries[2][1] > 0
    tpl = template()
    thinks = [True, False, True]
    for r, think in zip(recs, thinks):
        # The prompt is the official template over the conversation so far...
        want = tpl.render(messages=r["messages"], add_generation_prompt=True,
                          enable_thinking=think)
        assert r["prompt"] == hf_tok.encode(want, add_special_tokens=False).ids
        # ...and a fresh run over the same conversation (no reused state) gives the same tokens.
        path = os.path.join(str(tmp_path), f"conv{len(r['messages'])}.json")
        with open(path, "w", encoding="utf-8") as f:
            json.dump(r["messages"], f, ensure_ascii=False)
        _, _, [fresh] = wren("run", model, "--messages", path, "--temp", "0", "--max-tokens", "16",
                             *([] if think else ["--no-think"]), tmp_path=tmp_path)
        assert fresh["reused"] == 0
        assert fresh["prompt"] == r["prompt"]
        assert fresh["generated"] == r["generated"]


def test_chat_commands(model, tmp_path):
    lines = ["First question", "/reset", "First question", "/bogus", "/quit", "never sent"]
    _, summaries, recs = chat_turns(model, tmp_path, lines)
    assert len(recs) == 2  # /quit stops before the last line
    assert recs[0]["prompt"] == recs[1]["prompt"] and recs[0]["generated"] == recs[1]["generated"]
    assert summaries[1][1] == 0  # /reset forgot the state


def test_bad_options(model):
    for args in (["--top-p", "0"], ["--temp", "-1"], ["--max-tokens", "0"], ["--seed", "x"],
                 ["--raw", "--no-think"], ["--bogus"]):
        p = subprocess.run([WREN, "run", "-m", model, "-p", "x", *args], capture_output=True,
                           timeout=60)
        assert p.returncode == 2 and b"wren" in p.stderr, args
    p = subprocess.run([WREN, "run", "-m", model, "-p", "x", "--ctx", "4"], capture_output=True,
                       timeout=120)
    assert p.returncode == 1 and b"context" in p.stderr


def test_readme_demo(tmp_path):
    """The README's demo command (tools/demo.sh) runs to the end on the built-in default."""
    with open(os.path.join(SRC, "README.md"), encoding="utf-8") as f:
        assert "tools/demo.sh" in f.read()
    env = dict(os.environ, WREN_DEMO_MODEL=str(tmp_path / "tiny"))
    p = subprocess.run([os.path.join(SRC, "tools", "demo.sh")], cwd=SRC, env=env,
                       capture_output=True, timeout=1500)
    err = p.stderr.decode(errors="replace")
    assert p.returncode == 0, err[-3000:]
    assert len(re.findall(r"prefilled \d+ new tokens, \d+ reused", err)) >= 2
