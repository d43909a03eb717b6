"""Stopping `wren serve` (SIGTERM) with requests under way (also run under ASan+UBSan).

Every client gets a complete HTTP response: the queued ones a 503 error object at once, the
running one either its answer (when it ends within --shutdown-timeout) or a 503 / a stream that
ends with an error event and `data: [DONE]`. Never a dropped connection or a cut stream, and the
server exits, cleanly, within the bound.
"""
import json
import signal
import socket
import threading
import time

import pytest

from server_helpers import Server

NO_THINK = {"chat_template_kwargs": {"enable_thinking": False}}


def send(port, body):
    """Starts a chat completion on a fresh connection; returns the socket. Seeded: the random test
    model can sample its end token, so an unseeded "long" request sometimes ended by itself (with
    seed 1 it runs past 3,000 tokens)."""
    data = json.dumps({"messages": [{"role": "user", "content": "Keep talking"}], **NO_THINK,
                       "seed": 1, **body}).encode()
    s = socket.create_connection(("127.0.0.1", port), timeout=60)
    s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              b"Connection: close\r\nContent-Length: " + str(len(data)).encode() + b"\r\n\r\n" +
              data)
    return s


def dechunk(data):
    """The body of a chunked transfer; None when it does not end with the last (empty) chunk."""
    out = b""
    while True:
        line, sep, rest = data.partition(b"\r\n")
        if not sep:
            return None
        size = int(line.split(b";")[0], 16)
        if size == 0:
            return out
        if len(rest) < size + 2:
            return None
        out += rest[:size]
        data = rest[size + 2:]


class Response:
    """Reads one HTTP response to the end of the connection, in a thread."""

    def __init__(self, sock):
        self.sock, self.raw = sock, b""
        self.thread = threading.Thread(target=self._read)
        self.thread.start()

    def _read(self):
        try:
            while True:
                b = self.sock.recv(65536)
                if not b:
                    break
                self.raw += b
        except OSError:  # a reset: the response stays incomplete
            pass
        finally:
            self.sock.close()

    def result(self, timeout=60):
        """(status, headers text, body bytes or None when cut short)."""
        self.thread.join(timeout)
        assert not self.thread.is_alive(), "the response never ended"
        head, sep, body = self.raw.partition(b"\r\n\r\n")
        assert sep, f"no complete response: {self.raw[:200]!r}"
        status = int(head.split(b" ")[1])
        headers = head.decode().lower()
        if "transfer-encoding: chunked" in headers:
            body = dechunk(body)
        else:
            length = int(headers.split("content-length:")[1].split("\r\n")[0])
            body = body if len(body) == length else None
        return status, headers, body


def events(body):
    return [l[6:] for l in body.decode().split("\n") if l.startswith("data: ")]


def error_object(status, body, want_status, want_type):
    assert status == want_status, (status, body)
    doc = json.loads(body)
    assert doc["error"]["type"] == want_type and doc["error"]["message"], doc
    return doc


def wait_busy(srv, queued=0):
    t0 = time.time()
    while True:
        m = srv.metrics()
        if m["wren_busy"] == 1 and m["wren_queue_depth"] >= queued:
            return
        assert time.time() - t0 < 30, "the requests never started / queued"
        time.sleep(0.02)


def test_shutdown_with_a_running_stream_and_queued_requests():
    """The running stream outlives --shutdown-timeout: it ends with an error event and [DONE];
    the queued requests (streaming or not) get 503 error objects at once."""
    s = Server("--shutdown-timeout", "1")
    running = Response(send(s.port, {"stream": True, "max_tokens": 100000}))
    wait_busy(s)
    queued = [Response(send(s.port, {"stream": stream, "max_tokens": 4})) for stream in (False, True)]
    wait_busy(s, queued=2)
    t0 = time.time()
    s.proc.send_signal(signal.SIGTERM)
    for r in queued:
        status, headers, body = r.result()
        assert "application/json" in headers
        error_object(status, body, 503, "server_error")
    assert time.time() - t0 < 1, "queued requests were not answered at once"
    status, headers, body = running.result()
    assert status == 200 and "text/event-stream" in headers
    assert body is not None, "the stream was cut short"
    ev = events(body)
    assert ev[-1] == "[DONE]"
    err = json.loads(ev[-2])["error"]
    assert err["type"] == "server_error" and "shutting down" in err["message"]
    chunks = [json.loads(e) for e in ev[:-2]]
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert not any(c["choices"][0]["finish_reason"] for c in chunks)
    s.stop()
    assert time.time() - t0 < 10, "shutdown took longer than its bound"


def test_shutdown_ends_a_long_non_streaming_request_with_503():
    s = Server("--shutdown-timeout", "1")
    running = Response(send(s.port, {"max_tokens": 100000}))
    wait_busy(s)
    t0 = time.time()
    s.proc.send_signal(signal.SIGTERM)
    status, headers, body = running.result()
    error_object(status, body, 503, "server_error")
    s.stop()
    assert time.time() - t0 < 10, "shutdown took longer than its bound"


@pytest.mark.parametrize("stream", [False, True])
def test_shutdown_lets_a_short_request_finish(stream):
    """A request that ends within --shutdown-timeout gets its complete answer."""
    s = Server("--shutdown-timeout", "60")
    body = {"max_tokens": 24, "temperature": 0}
    if stream:
        body.update(stream=True, stream_options={"include_usage": True})
    running = Response(send(s.port, body))
    wait_busy(s)
    s.proc.send_signal(signal.SIGTERM)
    status, _, body = running.result()
    assert status == 200 and body is not None
    if stream:
        ev = events(body)
        assert ev[-1] == "[DONE]"
        usage = json.loads(ev[-2])["usage"]
        finish = [c["choices"][0]["finish_reason"] for c in map(json.loads, ev[:-2]) if c["choices"]]
        assert finish[-1] in ("stop", "length")
    else:
        doc = json.loads(body)
        assert doc["choices"][0]["finish_reason"] in ("stop", "length")
        usage = doc["usage"]
    assert 1 <= usage["completion_tokens"] <= 24
    s.stop()


def test_requests_during_shutdown_get_503():
    """Once stopping, a new request is refused with a 503 error object (the worker is still
    finishing the running one)."""
    s = Server("--shutdown-timeout", "2")
    running = Response(send(s.port, {"max_tokens": 100000}))
    wait_busy(s)
    s.proc.send_signal(signal.SIGTERM)
    time.sleep(0.3)
    late = Response(send(s.port, {"max_tokens": 2}))
    status, _, body = late.result()
    error_object(status, body, 503, "server_error")
    error_object(*running.result()[::2], 503, "server_error")
    s.stop()


def stopping_server():
    """A server stopping (SIGTERM sent) while a long request still runs: it stays in that state
    for --shutdown-timeout (5 s). Returns (server, the running request's Response)."""
    s = Server("--shutdown-timeout", "5")
    status, _, body = s.request("GET", "/health")
    assert status == 200 and json.loads(body) == {"status": "ok"}
    running = Response(send(s.port, {"max_tokens": 100000}))
    wait_busy(s)
    s.proc.send_signal(signal.SIGTERM)
    time.sleep(0.3)
    return s, running


def test_health_reports_shutdown():
    """Once stopping, /health answers 503 with an error object, so that load balancers stop
    sending traffic while the running request drains; the answer closes its connection."""
    s, running = stopping_server()
    t0 = time.time()
    status, headers, body = s.request("GET", "/health", timeout=5)
    assert time.time() - t0 < 1
    doc = error_object(status, body, 503, "server_error")
    assert "shutting down" in doc["error"]["message"]
    assert {k.lower(): v.lower() for k, v in headers.items()}.get("connection") == "close"
    error_object(*running.result()[::2], 503, "server_error")
    s.stop()


def test_new_requests_during_shutdown_get_503_at_once():
    """A request arriving while stopping is answered 503 at once, before its body is read (a
    client still uploading a large body is not made to finish it); every endpoint but /metrics
    answers so (the drain stays observable)."""
    s, running = stopping_server()
    sock = socket.create_connection(("127.0.0.1", s.port), timeout=10)
    sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: "
                 b"application/json\r\nContent-Length: 1000000\r\n\r\n{\"messages\": [")
    t0 = time.time()
    status, headers, body = Response(sock).result(timeout=10)
    assert time.time() - t0 < 1, "the 503 waited for the body"
    error_object(status, body, 503, "server_error")
    assert "connection: close" in headers
    status, _, body = s.request("GET", "/v1/models", timeout=5)
    error_object(status, body, 503, "server_error")
    status, _, body = s.request("GET", "/metrics", timeout=5)
    assert status == 200 and b"wren_busy 1" in body
    error_object(*running.result()[::2], 503, "server_error")
    s.stop()


def test_second_signal_stops_at_once():
    s = Server("--shutdown-timeout", "600")
    running = Response(send(s.port, {"stream": True, "max_tokens": 100000}))
    wait_busy(s)
    t0 = time.time()
    s.proc.send_signal(signal.SIGTERM)
    time.sleep(0.3)
    s.proc.send_signal(signal.SIGTERM)
    status, _, body = running.result()
    assert status == 200 and body is not None and events(body)[-1] == "[DONE]"
    assert json.loads(events(body)[-2])["error"]["type"] == "server_error"
    s.stop()
    assert time.time() - t0 < 10
