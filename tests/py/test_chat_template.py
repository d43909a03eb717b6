"""wren template vs jinja2 rendering the official Qwen3.5/3.6 chat templates, byte for byte.

The reference environment is HF transformers' (ImmutableSandboxedEnvironment, trim_blocks,
lstrip_blocks, tojson = json.dumps(ensure_ascii=False), raise_exception raising). Tool call
arguments given as JSON strings are parsed before rendering, as vLLM does (null/"" -> {}).
"""
import copy
import json
import os
import random
import subprocess

import pytest
from jinja2.sandbox import ImmutableSandboxedEnvironment

SRC = os.environ.get("WREN_SRC", os.path.join(os.path.dirname(__file__), "..", ".."))
WREN = os.environ.get("WREN_BIN", os.path.join(SRC, "build", "wren"))
FLAVORS = {"qwen3.6": "qwen3.6.jinja", "qwen3.5": "qwen3.5.jinja"}
N_CASES = 300


class Raised(Exception):
    pass


def load_template(name):
    def raise_exception(msg):
        raise Raised(msg)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                          sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    with open(os.path.join(SRC, "data", "chat_templates", name), encoding="utf-8") as f:
        return env.from_string(f.read())


def vllm_style(request):
    """Parses string tool-call arguments into mappings (what an OpenAI server does first)."""
    req = copy.deepcopy(request)
    for m in req.get("messages") or []:
        if not isinstance(m, dict) or m.get("role") != "assistant" or not isinstance(
                m.get("tool_calls"), list):
            continue
        for tc in m["tool_calls"]:
            if not isinstance(tc, dict):
                continue
            fn = tc.get("function", tc)
            if isinstance(fn, dict) and "arguments" in fn:
                a = fn["arguments"]
                if a is None or a == "":
                    fn["arguments"] = {}
                elif isinstance(a, str):
                    fn["arguments"] = json.loads(a)
    return req


def reference(template, request, add_generation_prompt):
    """('ok', text) | ('raise', reason) | ('error', repr) for any other exception."""
    try:
        req = vllm_style(request)
        kwargs = dict(req.get("chat_template_kwargs") or {})
        text = template.render(messages=req.get("messages"), tools=req.get("tools"),
                               add_generation_prompt=add_generation_prompt, **kwargs)
        return "ok", text
    except Raised as e:
        return "raise", str(e)
    except Exception as e:  # TypeError, UndefinedError, JSONDecodeError...
        return "error", repr(e)


# ---- conversation generator ----

TEXTS = [
    "Hello", "What's the weather in Paris?", "你好，世界", "日本語のテキスト", "emoji 🎉🚀 ok",
    'quotes "double" and \'single\'', "back\\slash \\n literal", "tabs\tand\nnewlines\n",
    "  padded  ", "\n\nleading newlines", "trailing newlines\n\n", "\u3000ideographic space\u3000",
    "nbsp\u00a0end\u00a0", "<tool_response>\nfake\n</tool_response>", "a < b > c & d",
    "<|im_start|> inside", "x" * 300, "", "line1\r\nline2", "combining e\u0301", "\u2028sep\u2029",
    "zero\u200bwidth", "{\"json\": [1, 2]}", "Ünïcödé ñ ç", "математика", "mixed 中文 and English",
]
REASONING = ["I should check.", "\nLet me think step by step.\n", "", "  ", "多步推理\n第二步",
             "Use the tool get_weather.", "a\n\nb"]
TOOL_NAMES = ["get_weather", "search", "run_code", "calc", "send_email", "工具"]


def r_text(rng):
    t = rng.choice(TEXTS)
    if rng.random() < 0.3:
        t = t + " " + rng.choice(TEXTS)
    return t


def r_scalar(rng):
    return rng.choice([
        rng.randint(-1000, 1000), 0, -1, 12345678901234567890, rng.random() * 100, 1.0, -0.0,
        2.5e20, 1e16, 1e-7, 0.0001, 3.14, True, False, None, r_text(rng), "", "42", "true",
        "null", "multi\nline\nvalue",
    ])


def r_value(rng, depth=0):
    k = rng.random()
    if depth < 2 and k < 0.15:
        return {rng.choice(["a", "b", "key", "名前", "x y"]): r_value(rng, depth + 1)
                for _ in range(rng.randint(0, 3))}
    if depth < 2 and k < 0.3:
        return [r_value(rng, depth + 1) for _ in range(rng.randint(0, 3))]
    return r_scalar(rng)


def r_schema(rng):
    props = {}
    for _ in range(rng.randint(0, 4)):
        name = rng.choice(["city", "query", "n", "flag", "options", "items", "unit", "ratio"])
        typ = rng.choice(["string", "integer", "number", "boolean", "object", "array", "null",
                          ["string", "null"]])
        p = {"type": typ, "description": r_text(rng)}
        if rng.random() < 0.3:
            p["enum"] = [r_scalar(rng) for _ in range(2)]
        if rng.random() < 0.2:
            p["default"] = r_scalar(rng)
        if rng.random() < 0.2:
            p["minimum"] = rng.choice([0, 0.5, -1e10, 1.0])
        props[name] = p
    return {"type": "object", "properties": props, "required": list(props)[:1]}


def r_tool(rng):
    fn = {"name": rng.choice(TOOL_NAMES), "description": r_text(rng), "parameters": r_schema(rng)}
    if rng.random() < 0.15:
        return fn  # bare function object, also seen in the wild
    return {"type": "function", "function": fn}


def r_args(rng):
    args = {rng.choice(["city", "query", "n", "flag", "opts", "data", "参数"]): r_value(rng)
            for _ in range(rng.randint(0, 4))}
    k = rng.random()
    if k < 0.45:
        return json.dumps(args, ensure_ascii=rng.random() < 0.5,
                          separators=rng.choice([None, (",", ":")]))
    if k < 0.9:
        return args
    return rng.choice([None, "", {}])


def r_tool_call(rng):
    fn = {"name": rng.choice(TOOL_NAMES)}
    if rng.random() < 0.95:
        fn["arguments"] = r_args(rng)
    if rng.random() < 0.1:
        return fn  # no "function" wrapper
    return {"id": "call_%d" % rng.randint(0, 999), "type": "function", "function": fn}


def r_content(rng, allow_media=True):
    k = rng.random()
    if k < 0.55:
        return r_text(rng)
    if k < 0.65:
        return rng.choice([None, ""])
    parts = []
    for _ in range(rng.randint(0, 4)):
        j = rng.random()
        if allow_media and j < 0.2:
            parts.append(rng.choice([{"type": "image", "image": "x.png"},
                                     {"type": "image_url", "image_url": {"url": "http://x/y.png"}},
                                     {"type": "image"}]))
        elif allow_media and j < 0.3:
            parts.append(rng.choice([{"type": "video", "video": "v.mp4"}, {"type": "video"}]))
        else:
            parts.append({"type": "text", "text": r_text(rng)})
    return parts


def r_assistant(rng):
    m = {"role": "assistant"}
    k = rng.random()
    content = r_content(rng, allow_media=False)
    if k < 0.3:
        m["reasoning_content"] = rng.choice(REASONING)
    elif k < 0.55 and (content is None or isinstance(content, str)):
        pre = rng.choice(["<think>\n", "", "<think>", "x<think>\n\n"])
        content = pre + rng.choice(REASONING) + rng.choice(["\n</think>\n\n", "</think>", "\n\n</think>\n"]) + (content or "")
    m["content"] = content
    if rng.random() < 0.35:
        m["tool_calls"] = [r_tool_call(rng) for _ in range(rng.randint(1, 3))]
    elif rng.random() < 0.05:
        m["tool_calls"] = []
    return m


def r_conversation(rng):
    msgs = []
    if rng.random() < 0.5:
        msgs.append({"role": "system", "content": r_content(rng, allow_media=False)})
    for turn in range(rng.randint(1, 4)):
        msgs.append({"role": "user", "content": r_content(rng)})
        for _ in range(rng.randint(0, 2)):
            a = r_assistant(rng)
            msgs.append(a)
            if "tool_calls" in a and a["tool_calls"]:
                for _ in range(rng.randint(1, 3)):
                    msgs.append({"role": "tool", "content": r_content(rng, allow_media=False),
                                 "tool_call_id": "call_1"})
    req = {"messages": msgs}
    if rng.random() < 0.5:
        req["tools"] = [r_tool(rng) for _ in range(rng.randint(1, 3))]
    elif rng.random() < 0.1:
        req["tools"] = rng.choice([[], None])
    kw = {}
    for key in ("enable_thinking", "preserve_thinking", "add_vision_id"):
        if rng.random() < 0.5:
            kw[key] = rng.random() < 0.5
    if kw or rng.random() < 0.2:
        req["chat_template_kwargs"] = kw
    return req


def r_rejected(rng):
    """Conversations the template refuses."""
    req = r_conversation(rng)
    msgs = req["messages"]
    kind = rng.randrange(7)
    if kind == 0:
        msgs.insert(rng.randint(1, len(msgs)), {"role": "system", "content": "late system"})
    elif kind == 1:
        msgs.insert(rng.randint(0, len(msgs)), {"role": rng.choice(["developer", "bot", ""]),
                                                "content": "x"})
    elif kind == 2:
        req["messages"] = [m for m in msgs if m["role"] not in ("user",)] or [
            {"role": "assistant", "content": "only me"}]
        if rng.random() < 0.5:
            req["messages"].append({"role": "user",
                                    "content": "<tool_response>\nr\n</tool_response>"})
    elif kind == 3:
        req["messages"] = [{"role": "system", "content": [{"type": "image"}, {"type": "text", "text": "s"}]}] + [m for m in msgs if m["role"] != "system"]
    elif kind == 4:
        req["messages"] = [{"role": "system", "content": [{"type": "video", "video": "v"}]}] + [m for m in msgs if m["role"] != "system"]
    elif kind == 5:
        msgs[-1]["content"] = rng.choice([5, {"text": "dict"}, True, [{"type": "audio"}]])
    else:
        req["messages"] = []
    return req


WILD_KEYS = ["role", "content", "text", "type", "image", "video", "image_url", "name",
             "arguments", "function", "x"]
WILD_SCALARS = [0, 1, -2.5, 1.0, True, False, None, "", "text", "image", "video", "user", "tool",
                "assistant", "system", "<tool_response>x</tool_response>", "a</think>b",
                "<think>r</think>c", " \u3000 "]


def wild(rng, depth=0):
    """Any JSON value, biased towards the words the template looks for."""
    k = rng.random()
    if depth < 3 and k < 0.2:
        return {rng.choice(WILD_KEYS): wild(rng, depth + 1) for _ in range(rng.randint(0, 3))}
    if depth < 3 and k < 0.35:
        return [wild(rng, depth + 1) for _ in range(rng.randint(0, 3))]
    return rng.choice(WILD_SCALARS)


def weird_case(rng):
    """A conversation with odd values in odd places (types the template does not expect)."""
    req = r_conversation(rng)
    msgs = req["messages"]
    for _ in range(rng.randint(1, 3)):
        m = rng.choice(msgs)
        key = rng.choice(["content", "role", "reasoning_content", "tool_calls"])
        if key == "role":
            m[key] = rng.choice(["user", "assistant", "tool", "system", wild(rng)])
        elif key == "tool_calls":
            m[key] = rng.choice([wild(rng), [wild(rng)], [{"function": wild(rng)}],
                                 [{"function": {"name": "f", "arguments": wild(rng)}}],
                                 [{"name": "g", "arguments": {"a": wild(rng)}}]])
        else:
            m[key] = wild(rng)
    if rng.random() < 0.3:
        req["tools"] = wild(rng)
    if rng.random() < 0.3:
        req["chat_template_kwargs"] = {
            k: wild(rng) for k in ("enable_thinking", "preserve_thinking", "add_vision_id")
            if rng.random() < 0.6}
    if rng.random() < 0.1:
        msgs.insert(rng.randint(0, len(msgs)), wild(rng))
    return req


def cases():
    rng = random.Random(20260529)
    out = [r_conversation(rng) for _ in range(N_CASES)]
    out += [r_rejected(rng) for _ in range(60)]
    out += [weird_case(rng) for _ in range(400)]
    # Hand-written corners.
    out += [
        {"messages": [{"role": "user", "content": "hi"}], "tools": "ab"},
        {"messages": [{"role": "user", "content": [{"text": 5}, {"text": None}, {"text": [1, "a'b", {"k": True}]}, "text here", ["image"]]}]},
        {"messages": [{"role": "tool", "content": "first"}, {"role": "user", "content": "q"}]},
        {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a", "tool_calls": "bad"}]},
        {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a", "tool_calls": {"x": 1}}]},
        {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": None, "tool_calls": [{"function": {"name": "f", "arguments": "{\"x\": 1.50, \"y\": -0, \"z\": 1E5, \"w\": 1e400, \"d\": 1, \"d\": 2}"}}]}]},
        {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "f", "arguments": "[1]"}}]}]},
        {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "", "tool_calls": [{"function": {"arguments": "{}"}}]}]},
        {"messages": [{"role": "user", "content": "q"}], "chat_template_kwargs": {"enable_thinking": 0}},
        {"messages": [{"role": "user", "content": "q"}, "not a message"]},
    ]
    return out


def run_wren(args):
    return subprocess.run([WREN, "template"] + args, capture_output=True, timeout=120)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    d = tmp_path_factory.mktemp("chat")
    reqs = cases()
    path = d / "requests.jsonl"
    with open(path, "w", encoding="utf-8") as f:
        for r in reqs:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
    return d, reqs, path


@pytest.mark.parametrize("flavor", list(FLAVORS))
@pytest.mark.parametrize("gen", [True, False])
def test_matches_jinja2(corpus, flavor, gen):
    d, reqs, path = corpus
    tmpl = load_template(FLAVORS[flavor])
    args = ["--flavor", flavor, "--requests-jsonl", str(path)]
    if not gen:
        args.append("--no-generation-prompt")
    p = run_wren(args)
    assert p.returncode == 0, p.stderr.decode()
    lines = p.stdout.decode("utf-8").split("\n")[:-1]
    assert len(lines) == len(reqs)
    kinds = {"ok": 0, "raise": 0, "error": 0}
    for i, (req, line) in enumerate(zip(reqs, lines)):
        got = json.loads(line)
        kind, want = reference(tmpl, req, gen)
        kinds[kind] += 1
        ctx = "case %d: %s" % (i, json.dumps(req, ensure_ascii=False)[:2000])
        if kind == "ok":
            assert "prompt" in got, ctx + "\nwren refused: " + got.get("error", "")
            assert got["prompt"] == want, ctx
        elif kind == "raise":
            assert "error" in got, ctx
            assert got["error"] == want, ctx
        else:
            assert "error" in got, ctx + "\njinja2 failed with " + want
    assert kinds["ok"] >= 250 and kinds["raise"] >= 40, kinds


def test_single_request_byte_exact(corpus, tmp_path):
    """The plain mode writes the prompt and nothing else; rejected requests exit non-zero."""
    _, reqs, _ = corpus
    tmpl = load_template(FLAVORS["qwen3.6"])
    for i, req in enumerate(reqs[:: len(reqs) // 25]):
        f = tmp_path / ("r%d.json" % i)
        f.write_text(json.dumps(req, ensure_ascii=False), encoding="utf-8")
        p = run_wren(["--request", str(f)])
        kind, want = reference(tmpl, req, True)
        if kind == "ok":
            assert p.returncode == 0, p.stderr.decode()
            assert p.stdout == want.encode("utf-8")
        else:
            assert p.returncode != 0 and p.stdout == b""
            if kind == "raise":
                assert want in p.stderr.decode()


def test_flavor_from_checkpoint_dir(tmp_path):
    """-m DIR picks the flavor from chat_template.jinja or tokenizer_config.json."""
    req = {"messages": [{"role": "user", "content": "q"},
                        {"role": "assistant", "content": "", "tool_calls": [
                            {"function": {"name": "f", "arguments": {"b": True}}}]}]}
    f = tmp_path / "req.json"
    f.write_text(json.dumps(req))
    expect = {}
    for flavor, name in FLAVORS.items():
        expect[flavor] = reference(load_template(name), req, True)[1]
    assert expect["qwen3.5"] != expect["qwen3.6"]
    for flavor, name in FLAVORS.items():
        text = open(os.path.join(SRC, "data", "chat_templates", name), encoding="utf-8").read()
        a = tmp_path / (flavor + "_a")
        a.mkdir()
        (a / "chat_template.jinja").write_text(text, encoding="utf-8")
        b = tmp_path / (flavor + "_b")
        b.mkdir()
        (b / "tokenizer_config.json").write_text(json.dumps({"chat_template": text}))
        for dir_ in (a, b):
            p = run_wren(["-m", str(dir_), "--request", str(f)])
            assert p.returncode == 0 and p.stdout.decode() == expect[flavor]
    p = run_wren(["--request", str(f)])  # no -m: Qwen3.6
    assert p.stdout.decode() == expect["qwen3.6"]


def test_numbers_and_whitespace_like_python(tmp_path):
    """Float spelling (repr: shortest round trip, 1e-05, 1e+16), ints of any size, str.strip()'s
    Unicode whitespace and repr() of nested values, each against jinja2 on one big request."""
    rng = random.Random(7)
    floats = [rng.uniform(-1e6, 1e6) for _ in range(300)]
    floats += [2.0 ** rng.randint(-1074, 1023) * rng.choice([1, -1]) for _ in range(300)]
    floats += [rng.random() * 10.0 ** rng.randint(-30, 30) for _ in range(300)]
    floats += [1e16, 1e15, 123456789012345678.0, 0.0001, 0.00001, 5e-324, 1.7976931348623157e308,
               0.1, 0.2 + 0.1, 1e22, 9007199254740993.0, -0.0, 100.0]
    ints = [0, -1, 2 ** 64, -(10 ** 30), 10 ** 100]
    spaces = [chr(c) for c in range(0x3100) if chr(c).isspace()] + ["\u200b", "\ufeff", "\x1b"]
    msgs = [{"role": "system", "content": "".join(spaces) + "sys" + "".join(spaces)}]
    for s in spaces:
        msgs.append({"role": "user", "content": s + "q" + s})
        msgs.append({"role": "assistant", "content": s + "<think>" + s + "r" + s + "</think>" + s + "a" + s})
    msgs.append({"role": "user", "content": [{"text": {"k'": ["a\"b", "é\u0085\x07\u200b\U0001f600", 1.5, None, True]}}]})
    msgs.append({"role": "assistant", "content": "", "tool_calls": [
        {"function": {"name": "f", "arguments": json.dumps({"f": floats, "i": ints, "x": 1e-7, "y": 2.5, "b": False, "n": None})}},
        {"function": {"name": "g", "arguments": {"x": 1e-7, "y": 2.5, "z": 3, "b": False, "n": None}}}]})
    req = {"messages": msgs}
    path = tmp_path / "req.json"
    path.write_text(json.dumps(req, ensure_ascii=False), encoding="utf-8")
    for flavor, name in FLAVORS.items():
        kind, want = reference(load_template(name), req, True)
        assert kind == "ok", want
        p = run_wren(["--flavor", flavor, "--request", str(path)])
        assert p.returncode == 0, p.stderr.decode()
        got = p.stdout.decode("utf-8")
        if got != want:
            i = next(k for k in range(min(len(got), len(want))) if got[k] != want[k])
            pytest.fail("%s differs at %d: wren %r vs jinja2 %r" % (flavor, i, got[i - 40:i + 40], want[i - 40:i + 40]))
