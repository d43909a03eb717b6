"""wren template on requests the template rejects and on malformed JSON: a clean error (exit 1,
the reason on stderr, nothing on stdout), never a crash. Also runs in the ASan+UBSan build."""
import json
import random

import test_chat_template as tct

SANITIZER_MARKS = (b"Sanitizer", b"runtime error:", b"LeakSanitizer")


def check_clean_failure(p, reason=None):
    assert not any(m in p.stderr for m in SANITIZER_MARKS), p.stderr.decode(errors="replace")
    assert p.returncode == 1 and p.stdout == b"", p.stderr
    assert p.stderr.startswith(b"wren template: ")
    if reason:
        assert reason in p.stderr.decode()


def test_rejected_conversations(tmp_path):
    rng = random.Random(99)
    reqs = [tct.r_rejected(rng) for _ in range(40)]
    tmpl = tct.load_template("qwen3.6.jinja")
    for i, req in enumerate(reqs):
        kind, want = tct.reference(tmpl, req, True)
        if kind == "ok":
            continue
        f = tmp_path / ("r%d.json" % i)
        f.write_text(json.dumps(req, ensure_ascii=False), encoding="utf-8")
        check_clean_failure(tct.run_wren(["--request", str(f)]),
                            want if kind == "raise" else None)


MALFORMED = [
    b"", b"{", b"[1,]", b'{"messages": "x"', b"\xff", b"nul\x00l", b"{}", b"[]", b"null", b"5",
    b'{"messages": [{"role": "user", "content": "\\ud800"}]}',
    b'{"messages": [{"role": "user", "content": "a\x01b"}]}',
    b'{"messages": [{"role": "user", "content": "\xc0\xaf"}]}',
    b'{"messages": [{"role": "user", "content": "q"}]} extra',
    b'{"messages": [{"role": "user", "content": 01}]}',
    b"[" * 100000 + b"]" * 100000,
    b'{"messages": [{"role": "user", "content": ' + b"1" * 5000 + b"}]}",
    b'{"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "tool_calls": '
    b'[{"function": {"name": "f", "arguments": "{\\"a\\": "}}]}]}',
    b'{"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "tool_calls": '
    b'[{"function": {"name": 5, "arguments": "{}"}}]}]}',
]


def test_malformed_json(tmp_path):
    for i, data in enumerate(MALFORMED):
        f = tmp_path / ("bad%d.json" % i)
        f.write_bytes(data)
        check_clean_failure(tct.run_wren(["--request", str(f)]))
    check_clean_failure(tct.run_wren(["--request", str(tmp_path / "missing.json")]),
                        "missing.json")


def test_batch_mode_reports_each_error(tmp_path):
    f = tmp_path / "batch.jsonl"
    f.write_bytes(b"\n".join([b'{"messages": [{"role": "user", "content": "q"}]}', b"{",
                              b'{"messages": []}', b'{"messages": [{"role": "user", "content": "ok"}]}']) + b"\n")
    p = tct.run_wren(["--requests-jsonl", str(f)])
    assert p.returncode == 0 and not any(m in p.stderr for m in SANITIZER_MARKS)
    out = [json.loads(x) for x in p.stdout.decode().split("\n")[:-1]]
    assert [("prompt" in o) for o in out] == [True, False, False, True]
    assert out[2]["error"] == "No messages provided."
