"""`wren serve` end to end with the official openai client, on a tiny synthesized model.

Parsing tests use the hidden --test-replay option: the request's "wren_replay" text is tokenized
and fed through the real output path (detokenizer, stop strings, reasoning/tool-call parser,
streaming) in place of sampled tokens. Everything else runs the real model.
"""
import json
import os
import socket
import time

import jinja2
import pytest
from tokenizers import Tokenizer

from server_helpers import SRC, TOKENIZER_DIR, Server, model_variant

TOOLS = [{
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather for a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "days": {"type": "integer"},
                           "metric": {"type": "boolean"}},
            "required": ["city"],
        },
    },
}]
NO_THINK = {"chat_template_kwargs": {"enable_thinking": False}}


@pytest.fixture(scope="module")
def srv():
    s = Server("--test-replay", "--snapshot-every", "16")
    yield s
    s.stop()


@pytest.fixture(scope="module")
def client(srv):
    return srv.client()


def reference_prompt_ids(messages, **kwargs):
    """Prompt tokens from the official template (jinja2) and the HF tokenizer."""
    env = jinja2.Environment(trim_blocks=True, lstrip_blocks=True,
                             extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = lambda x, **k: json.dumps(x, ensure_ascii=False)
    # an OpenAI server parses string tool-call arguments before rendering (as vLLM does)
    messages = json.loads(json.dumps(messages))
    for m in messages:
        for tc in m.get("tool_calls") or []:
            if isinstance(tc["function"].get("arguments"), str):
                tc["function"]["arguments"] = json.loads(tc["function"]["arguments"] or "{}")
    with open(os.path.join(SRC, "data", "chat_templates", "qwen3.6.jinja")) as f:
        text = env.from_string(f.read()).render(messages=messages, add_generation_prompt=True,
                                                **kwargs)
    tok = Tokenizer.from_file(os.path.join(TOKENIZER_DIR, "tokenizer.json"))
    return tok.encode(text, add_special_tokens=False).ids


def reference_prompt_tokens(messages, **kwargs):
    return len(reference_prompt_ids(messages, **kwargs))


def test_health_models_metrics(srv, client):
    status, _, body = srv.request("GET", "/health")
    assert status == 200 and json.loads(body)["status"] == "ok"
    models = client.models.list()
    assert [m.id for m in models.data] == ["tiny"]
    m = srv.metrics()
    for key in ("wren_queue_depth", "wren_prefill_tokens_per_second",
                "wren_decode_tokens_per_second", "wren_cache_hits_total", "wren_cache_bytes",
                'wren_requests_total{outcome="ok"}', "wren_completion_tokens_total"):
        assert key in m, key


def test_non_streaming(client):
    msgs = [{"role": "system", "content": "You are terse."},
            {"role": "user", "content": "Name three colours."}]
    r = client.chat.completions.create(model="tiny", messages=msgs, max_tokens=12, temperature=0)
    assert r.object == "chat.completion" and r.id.startswith("chatcmpl-")
    assert r.model == "tiny" and r.created > 0
    c = r.choices[0]
    assert c.index == 0 and c.message.role == "assistant"
    assert c.finish_reason in ("stop", "length")
    assert r.usage.prompt_tokens == reference_prompt_tokens(msgs)
    assert 1 <= r.usage.completion_tokens <= 12
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
    if c.finish_reason == "length":
        assert r.usage.completion_tokens == 12


def test_streaming_matches_non_streaming(client):
    msgs = [{"role": "user", "content": "Count to five."}]
    kw = dict(model="tiny", messages=msgs, max_tokens=16, temperature=0, extra_body=NO_THINK)
    full = client.chat.completions.create(**kw)
    chunks = list(client.chat.completions.create(stream=True,
                                                 stream_options={"include_usage": True}, **kw))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    finish = [ch.choices[0].finish_reason for ch in chunks if ch.choices and ch.choices[0].finish_reason]
    assert text == full.choices[0].message.content
    assert finish == [full.choices[0].finish_reason]
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == full.usage.completion_tokens
    assert chunks[-1].usage.prompt_tokens == reference_prompt_tokens(msgs, enable_thinking=False)
    assert all(ch.id == chunks[0].id for ch in chunks)
    # Without include_usage no chunk carries usage.
    plain = list(client.chat.completions.create(stream=True, **kw))
    assert all(ch.usage is None for ch in plain)


def test_max_tokens_and_logprobs(client):
    r = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "Go"}],
                                       max_completion_tokens=3, temperature=0, logprobs=True,
                                       top_logprobs=2, extra_body=NO_THINK)
    c = r.choices[0]
    assert r.usage.completion_tokens <= 3
    lp = c.logprobs.content
    assert len(lp) >= r.usage.completion_tokens - 1
    for e in lp:
        assert e.logprob <= 0 and len(e.top_logprobs) == 2
        # greedy: the sampled token is the most likely one
        assert e.top_logprobs[0].logprob >= e.top_logprobs[1].logprob
        assert abs(e.top_logprobs[0].logprob - e.logprob) < 1e-4


def test_stop_sequences_replay(client):
    kw = dict(model="tiny", messages=[{"role": "user", "content": "Hi"}], extra_body={
        **NO_THINK, "wren_replay": "Hello world. Goodbye world."}, stop=["world", "zzz"])
    r = client.chat.completions.create(**kw)
    assert r.choices[0].message.content == "Hello "
    assert r.choices[0].finish_reason == "stop"
    text = "".join(ch.choices[0].delta.content or ""
                   for ch in client.chat.completions.create(stream=True, **kw))
    assert text == "Hello "


def test_stop_sequence_real_path(client):
    base = dict(model="tiny", messages=[{"role": "user", "content": "Write a story."}],
                max_tokens=24, temperature=0, extra_body=NO_THINK)
    full = client.chat.completions.create(**base).choices[0].message.content
    if len(full) < 4:
        pytest.fail(f"the tiny model produced too little text to cut: {full!r}")
    stop = full[len(full) // 2:len(full) // 2 + 2]
    cut = client.chat.completions.create(stop=[stop], **base)
    assert cut.choices[0].message.content == full[:full.index(stop)]
    assert cut.choices[0].finish_reason == "stop"


def test_reasoning_split_replay(client):
    replay = "Let me think <b>about</b> it.\n</think>\n\nThe answer is 4."
    kw = dict(model="tiny", messages=[{"role": "user", "content": "2+2?"}],
              extra_body={"wren_replay": replay})
    r = client.chat.completions.create(**kw)
    m = r.choices[0].message
    assert m.reasoning_content == "Let me think <b>about</b> it."
    assert m.content == "The answer is 4."
    reasoning, content = "", ""
    for ch in client.chat.completions.create(stream=True, **kw):
        if not ch.choices:
            continue
        d = ch.choices[0].delta
        reasoning += getattr(d, "reasoning_content", None) or ""
        piece = d.content or ""
        assert "<" not in piece and "think>" not in piece, piece
        content += piece
    assert reasoning == m.reasoning_content and content == m.content


def tool_call_text(city, days):
    return ("<tool_call>\n<function=get_weather>\n<parameter=city>\n" + city +
            "\n</parameter>\n<parameter=days>\n" + str(days) +
            "\n</parameter>\n</function>\n</tool_call>")


def test_tool_call_round_trip(client):
    msgs = [{"role": "user", "content": "Weather in Paris for 3 days?"}]
    replay = "I should call the tool.\n</think>\n\n" + tool_call_text("Paris", 3)
    r = client.chat.completions.create(model="tiny", messages=msgs, tools=TOOLS,
                                       extra_body={"wren_replay": replay})
    c = r.choices[0]
    assert c.finish_reason == "tool_calls"
    assert c.message.reasoning_content == "I should call the tool."
    assert not c.message.content
    (call,) = c.message.tool_calls
    assert call.type == "function" and call.function.name == "get_weather" and call.id
    assert json.loads(call.function.arguments) == {"city": "Paris", "days": 3}

    # streamed: the same call, assembled from tool_calls deltas
    calls = {}
    finish = None
    for ch in client.chat.completions.create(model="tiny", messages=msgs, tools=TOOLS, stream=True,
                                             extra_body={"wren_replay": replay}):
        if not ch.choices:
            continue
        for tc in ch.choices[0].delta.tool_calls or []:
            e = calls.setdefault(tc.index, {"name": "", "arguments": ""})
            e["name"] += tc.function.name or ""
            e["arguments"] += tc.function.arguments or ""
        assert not (ch.choices[0].delta.content or "").strip()
        finish = ch.choices[0].finish_reason or finish
    assert finish == "tool_calls"
    assert calls[0]["name"] == "get_weather"
    assert json.loads(calls[0]["arguments"]) == {"city": "Paris", "days": 3}

    # the result goes back; the real model answers (any text, well-formed)
    msgs += [{"role": "assistant", "content": None, "tool_calls": [
        {"id": call.id, "type": "function",
         "function": {"name": "get_weather", "arguments": call.function.arguments}}]},
             {"role": "tool", "tool_call_id": call.id, "content": '{"temp_c": 21}'}]
    r2 = client.chat.completions.create(model="tiny", messages=msgs, tools=TOOLS, max_tokens=8,
                                        temperature=0)
    assert r2.choices[0].finish_reason in ("stop", "length", "tool_calls")
    assert r2.usage.prompt_tokens == reference_prompt_tokens(msgs, tools=TOOLS)


def test_tool_choice(client):
    msgs = [{"role": "user", "content": "Weather?"}]
    # none: tools are not offered, a call the model writes stays text
    r = client.chat.completions.create(model="tiny", messages=msgs, tools=TOOLS,
                                       tool_choice="none", extra_body={
                                           **NO_THINK, "wren_replay": "plain answer"})
    assert r.choices[0].message.content == "plain answer" and not r.choices[0].message.tool_calls
    assert r.usage.prompt_tokens == reference_prompt_tokens(msgs, enable_thinking=False)
    # named: the opening of the call is forced, the model writes the rest
    r = client.chat.completions.create(
        model="tiny", messages=msgs, tools=TOOLS,
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
        extra_body={**NO_THINK, "wren_replay":
                    "<parameter=city>\nOslo\n</parameter>\n</function>\n</tool_call>"})
    (call,) = r.choices[0].message.tool_calls
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Oslo"}
    # with thinking, the opening is forced right after </think>
    r = client.chat.completions.create(
        model="tiny", messages=msgs, tools=TOOLS,
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
        extra_body={"wren_replay": "Rome, surely.\n</think><parameter=city>\nRome\n"
                                   "</parameter>\n</function>\n</tool_call>"})
    m = r.choices[0].message
    assert m.reasoning_content == "Rome, surely."
    (call,) = m.tool_calls
    assert json.loads(call.function.arguments) == {"city": "Rome"}
    assert r.choices[0].finish_reason == "tool_calls"
    # real path with required: well-formed whatever the random model writes
    r = client.chat.completions.create(model="tiny", messages=msgs, tools=TOOLS,
                                       tool_choice="required", max_tokens=10, temperature=0)
    assert r.choices[0].finish_reason in ("stop", "length", "tool_calls")


def conversation(client, turns, prompts=None, **kw):
    """Runs a multi-turn greedy conversation; returns (replies, usages). `prompts` receives the
    reference prompt tokens of each turn."""
    prompts = [] if prompts is None else prompts
    msgs, replies, usages = [{"role": "system", "content": "You are a helpful assistant. " * 4}], [], []
    for t in turns:
        msgs.append({"role": "user", "content": t})
        prompts.append(reference_prompt_ids(msgs, **kw.get("extra_body", {}).get(
            "chat_template_kwargs", {})))
        r = client.chat.completions.create(model="tiny", messages=msgs, max_tokens=12,
                                           temperature=0, logprobs=True, **kw)
        reply = r.choices[0].message.content
        replies.append((reply, [e.token for e in r.choices[0].logprobs.content],
                        r.usage.completion_tokens))
        usages.append(r.usage)
        msgs.append({"role": "assistant", "content": reply})
    return replies, usages


TURNS = ["Tell me about the sea.", "And about mountains?", "Which do you prefer, and why?"]


def test_session_reuse_prefills_only_new_tokens(srv, client):
    before = srv.metrics()
    prompts = []
    replies, usages = conversation(client, TURNS, prompts, extra_body=NO_THINK)
    after = srv.metrics()
    im_start = Tokenizer.from_file(os.path.join(TOKENIZER_DIR, "tokenizer.json")).token_to_id(
        "<|im_start|>")
    assert usages[0].prompt_tokens_details.cached_tokens < usages[0].prompt_tokens
    for prev, cur, u in zip(prompts, prompts[1:], usages[1:]):
        # Everything before the previous turn's generation prompt is resumed (the template
        # renders a past assistant turn without the empty think block, so the sequences
        # diverge right after "<|im_start|>assistant\n").
        turn_start = len(prev) - 1 - prev[::-1].index(im_start)
        assert cur[:turn_start] == prev[:turn_start]
        assert u.prompt_tokens == len(cur)
        assert u.prompt_tokens_details.cached_tokens == turn_start
    fed = after["wren_prefill_tokens_total"] - before["wren_prefill_tokens_total"]
    total = sum(u.prompt_tokens for u in usages)
    cached = sum(u.prompt_tokens_details.cached_tokens for u in usages)
    assert fed == total - cached
    assert after["wren_cache_hits_total"] - before["wren_cache_hits_total"] >= 2


@pytest.fixture(scope="module")
def plain():
    """A second server with session reuse disabled: the reference for identical outputs."""
    s = Server("--cache-mb", "0")
    yield s
    s.stop()


def test_reuse_gives_identical_greedy_outputs(client, plain):
    for kw in (NO_THINK, {}):
        with_reuse, u1 = conversation(client, TURNS, extra_body=kw)
        without, u2 = conversation(plain.client(), TURNS, extra_body=kw)
        assert with_reuse == without
        assert [u.prompt_tokens for u in u1] == [u.prompt_tokens for u in u2]
        assert all(u.prompt_tokens_details.cached_tokens == 0 for u in u2)
        assert any(u.prompt_tokens_details.cached_tokens > 0 for u in u1)


def test_diverging_prompt_resumes_from_snapshot(client, plain):
    """An edited message: the prompt diverges mid-way; the state resumes from the last periodic
    snapshot (every 16 tokens here) before the divergence, not from zero."""
    shared = "The quick brown fox jumps over the lazy dog. " * 8
    a = [{"role": "user", "content": shared + "First ending."}]
    b = [{"role": "user", "content": shared + "Second, different ending."}]
    tok = Tokenizer.from_file(os.path.join(TOKENIZER_DIR, "tokenizer.json"))
    ta = tok.encode("<|im_start|>user\n" + a[0]["content"]).ids
    tb = tok.encode("<|im_start|>user\n" + b[0]["content"]).ids
    common = next(i for i, (x, y) in enumerate(zip(ta, tb)) if x != y)
    assert common > 64
    client.chat.completions.create(model="tiny", messages=a, max_tokens=4, temperature=0)
    rb = client.chat.completions.create(model="tiny", messages=b, max_tokens=4, temperature=0,
                                        logprobs=True)
    cached = rb.usage.prompt_tokens_details.cached_tokens
    assert cached % 16 == 0 and common - 16 < cached <= common, (cached, common)
    ref = plain.client().chat.completions.create(model="tiny", messages=b, max_tokens=4,
                                                 temperature=0, logprobs=True)
    assert [e.token for e in rb.choices[0].logprobs.content] == \
        [e.token for e in ref.choices[0].logprobs.content]


def test_cancel_on_disconnect(srv):
    before = srv.metrics()
    body = json.dumps({"model": "tiny", "messages": [{"role": "user", "content": "Go on forever"}],
                       "stream": True, "max_tokens": 100000, "temperature": 1.0, "seed": 1,
                       "chat_template_kwargs": {"enable_thinking": False}}).encode()
    s = socket.create_connection(("127.0.0.1", srv.port), timeout=30)
    s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
    got = b""
    while got.count(b"data: ") < 3:
        got += s.recv(4096)
    s.close()
    t0 = time.time()
    while time.time() - t0 < 10:
        m = srv.metrics()
        if m["wren_busy"] == 0 and m['wren_requests_total{outcome="cancelled"}'] > before[
                'wren_requests_total{outcome="cancelled"}']:
            break
        time.sleep(0.05)
    else:
        pytest.fail("generation did not stop after the client disconnected")
    generated = m["wren_completion_tokens_total"] - before["wren_completion_tokens_total"]
    assert generated < 4096 - 20  # it did not run to the end of the context
    # the slot is free: the next request is answered at once
    status, _, _ = srv.request("POST", "/v1/chat/completions", {
        "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}, timeout=30)
    assert status == 200


def wait_until_idle(srv, before, what, limit=10):
    """Waits for the worker to be free with one more cancelled request than `before`."""
    key = 'wren_requests_total{outcome="cancelled"}'
    t0 = time.time()
    while time.time() - t0 < limit:
        m = srv.metrics()
        if m["wren_busy"] == 0 and m[key] > before[key]:
            return m
        time.sleep(0.05)
    pytest.fail(what)


def test_cancel_on_disconnect_behind_pipelined_bytes(srv):
    """A non-streaming client that sends more bytes (a pipelined request) and then closes: its
    FIN sits behind the unread bytes, and must still free the worker at once."""
    before = srv.metrics()
    s = start_chat(srv)
    s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
    s.close()
    m = wait_until_idle(srv, before, "generation did not stop after the client disconnected")
    generated = m["wren_completion_tokens_total"] - before["wren_completion_tokens_total"]
    assert generated < 4096 - 20  # it did not run to the end of the context


def start_chat(srv, **fields):
    """Sends a chat completion (a long one unless told) on a fresh connection; returns the
    socket once the worker is computing it. Seeded, so that the random model cannot end it early
    by sampling its end token (seed 1 runs past 3,000 tokens)."""
    body = json.dumps({"messages": [{"role": "user", "content": "Go on forever"}],
                       "max_tokens": 100000, "temperature": 1.0, "seed": 1, **NO_THINK,
                       **fields}).encode()
    s = socket.create_connection(("127.0.0.1", srv.port), timeout=30)
    s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
    t0 = time.time()
    while srv.metrics()["wren_busy"] == 0:
        assert time.time() - t0 < 10, "the request never started"
        time.sleep(0.02)
    time.sleep(0.2)  # the server is now waiting on the model, not reading the socket
    return s


def flood(sock, limit, stall=0.5):
    """Sends junk until `limit` bytes are out or nothing more fits for `stall` seconds (the
    buffers on both sides are full: nobody reads). Returns the bytes sent."""
    sock.setblocking(False)
    sent, last = 0, time.time()
    junk = b"x" * 65536
    while sent < limit and time.time() - last < stall:
        try:
            sent += sock.send(junk)
            last = time.time()
        except BlockingIOError:
            time.sleep(0.01)
    sock.setblocking(True)
    return sent


def test_cancel_on_disconnect_behind_a_flood(srv):
    """A client that sends more than the socket buffers hold and then closes: its FIN stays in
    its own send queue behind bytes the server's full receive buffer cannot take, so it never
    arrives (POLLRDHUP alone sees nothing). The server must read the bytes to let it in."""
    before = srv.metrics()
    s = start_chat(srv)
    sent = flood(s, 64 << 20)
    s.close()  # with unsent bytes queued: a FIN after them, not a reset
    assert sent > 64 << 10
    m = wait_until_idle(srv, before, "generation did not stop after the client disconnected")
    generated = m["wren_completion_tokens_total"] - before["wren_completion_tokens_total"]
    assert generated < 4096 - 20  # it did not run to the end of the context


def read_to_end(sock, timeout=30):
    sock.settimeout(timeout)
    data = b""
    while True:
        b = sock.recv(65536)
        if not b:
            return data
        data += b


def test_flood_behind_a_request_closes_the_connection_after_its_answer(srv):
    """A client still there that sends far more than a pipelined request while it waits: the
    bytes are dropped (that is how a close behind them is seen), so they cannot be taken for a
    next request. The answer says `Connection: close` and the connection ends after it."""
    s = start_chat(srv, max_tokens=48)
    sent = flood(s, 2 << 20)
    assert sent > 64 << 10
    raw = read_to_end(s)
    s.close()
    head, _, body = raw.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200"), raw[:300]
    assert b"connection: close" in head.lower()
    assert json.loads(body)["choices"][0]["finish_reason"] in ("stop", "length")


def test_small_pipelined_request_is_kept(srv):
    """A request pipelined behind a running one stays intact: checking for a disconnect reads
    nothing while the unread bytes are few, and the next request is answered on the same
    connection."""
    s = start_chat(srv, max_tokens=48)
    s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    raw = read_to_end(s)
    s.close()
    first, sep, rest = raw.partition(b"\r\n\r\n")
    assert first.startswith(b"HTTP/1.1 200"), raw[:300]
    assert rest.count(b"HTTP/1.1 200") == 1 and rest.endswith(b'{"status":"ok"}'), raw[-300:]


def test_cancel_while_queued(srv):
    """A request waiting behind another leaves the queue when its client goes away."""
    before = srv.metrics()

    def start(stream, max_tokens):
        body = json.dumps({"messages": [{"role": "user", "content": "Keep talking"}],
                           "stream": stream, "max_tokens": max_tokens, "seed": 1,
                           "chat_template_kwargs": {"enable_thinking": False}}).encode()
        s = socket.create_connection(("127.0.0.1", srv.port), timeout=30)
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
                  b"Content-Type: application/json\r\nContent-Length: " +
                  str(len(body)).encode() + b"\r\n\r\n" + body)
        return s

    running = start(True, 100000)
    assert running.recv(4096).startswith(b"HTTP/1.1 200")
    waiting = start(False, 5)
    t0 = time.time()
    while srv.metrics()["wren_queue_depth"] < 1:
        assert time.time() - t0 < 10, "the second request never queued"
        time.sleep(0.02)
    waiting.close()
    while srv.metrics()["wren_queue_depth"] > 0:
        assert time.time() - t0 < 10, "the abandoned request stayed in the queue"
        time.sleep(0.02)
    running.close()
    while srv.metrics()["wren_busy"]:
        assert time.time() - t0 < 20, "the running request was not cancelled"
        time.sleep(0.02)
    m = srv.metrics()
    key = 'wren_requests_total{outcome="cancelled"}'
    assert m[key] - before[key] == 2


def test_context_overflow(srv, client):
    import openai
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="tiny", messages=[
            {"role": "user", "content": "lorem ipsum " * 3000}], max_tokens=2)
    assert "context length" in e.value.body["message"]
    assert srv.alive()


def test_cache_budget_is_respected():
    """With a budget of 5 MiB (about two snapshots of the tiny model) the cache never holds
    more, evicts the least recently used, and a continuing conversation still resumes."""
    s = Server("--cache-mb", "5")
    try:
        c = s.client()
        for i in range(4):
            replies, usages = conversation(c, [f"Topic {i}: tell me something.", "More."],
                                           extra_body=NO_THINK)
            m = s.metrics()
            assert m["wren_cache_bytes"] <= 5 << 20
            assert usages[1].prompt_tokens_details.cached_tokens > 0
        assert m["wren_cache_entries"] >= 1
    finally:
        s.stop()


def test_interleaved_conversations(client, plain):
    """Two conversations taking turns each resume from their own saved turn start, with the
    same greedy outputs as without reuse."""
    im_start = Tokenizer.from_file(os.path.join(TOKENIZER_DIR, "tokenizer.json")).token_to_id(
        "<|im_start|>")
    convs = {k: [{"role": "user", "content": f"Conversation {k}: say something about {k}."}]
             for k in ("apples", "boats")}
    prev_prompt = {}
    for turn in range(2):
        for k, msgs in convs.items():
            kw = dict(model="tiny", messages=msgs, max_tokens=6, temperature=0, logprobs=True,
                      extra_body=NO_THINK)
            r = client.chat.completions.create(**kw)
            ref = plain.client().chat.completions.create(**kw)
            assert [e.token for e in r.choices[0].logprobs.content] == \
                [e.token for e in ref.choices[0].logprobs.content]
            cached = r.usage.prompt_tokens_details.cached_tokens
            if turn:
                p = prev_prompt[k]
                assert cached == len(p) - 1 - p[::-1].index(im_start)
            prev_prompt[k] = reference_prompt_ids(msgs, enable_thinking=False)
            msgs += [{"role": "assistant", "content": r.choices[0].message.content},
                     {"role": "user", "content": "Go on."}]


def test_generation_config_eos_ends_the_reply(tmp_path):
    """The server ends a reply on every id of generation_config.json's eos_token_id, as `wren
    run` does, not only on <|im_end|>/<|endoftext|>. Here " world" is listed as an end token."""
    tok = Tokenizer.from_file(os.path.join(TOKENIZER_DIR, "tokenizer.json"))
    world = tok.token_to_id("\u0120world")
    ends = [tok.token_to_id("<|im_end|>"), tok.token_to_id("<|endoftext|>"), world]
    model = model_variant(str(tmp_path / "tiny-eos"), {"eos_token_id": ends, "temperature": 1.0})
    s = Server("--test-replay", model=model)
    try:
        kw = dict(model="tiny", messages=[{"role": "user", "content": "Hi"}],
                  extra_body={**NO_THINK, "wren_replay": "Hello world, again."})
        r = s.client().chat.completions.create(**kw)
        assert r.choices[0].message.content == "Hello"
        assert r.choices[0].finish_reason == "stop"
        assert r.usage.completion_tokens == 2  # the end token counts, as with <|im_end|>
        chunks = list(s.client().chat.completions.create(stream=True, **kw))
        assert "".join(ch.choices[0].delta.content or "" for ch in chunks) == "Hello"
        assert chunks[-1].choices[0].finish_reason == "stop"
    finally:
        s.stop()
