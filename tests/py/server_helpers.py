"""Starting and talking to a real `wren serve` for the server tests.

The model is a tiny synthesized checkpoint with the real Qwen3 tokenizer (`wren synth --preset
tiny`). Each server listens on a free loopback port (--port 0; the port is read from its log line)
and is stopped with SIGTERM at the end; a crash or a non-zero exit fails the test.
"""
import json
import os
import re
import signal
import socket
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.request

SRC = os.environ.get("WREN_SRC", os.path.join(os.path.dirname(__file__), "..", ".."))
WREN = os.environ.get("WREN_BIN", os.path.join(SRC, "build", "wren"))
TOKENIZER_DIR = os.path.join(SRC, "data", "tokenizers", "qwen3")

_model_lock = threading.Lock()
_model_dir = None


def tiny_model():
    """Synthesizes the tiny model once per test process (WREN_TEST_MODEL=DIR: use that one)."""
    global _model_dir
    with _model_lock:
        if _model_dir is None and os.environ.get("WREN_TEST_MODEL"):
            _model_dir = os.environ["WREN_TEST_MODEL"]
        if _model_dir is None:
            out = os.path.join(tempfile.mkdtemp(prefix="wren-serve-test-"), "tiny")
            subprocess.run([WREN, "synth", "--preset", "tiny", "--tokenizer", TOKENIZER_DIR,
                            "--out", out], check=True, capture_output=True, timeout=600)
            _model_dir = out
        return _model_dir


class Server:
    def __init__(self, *args, ctx=4096, model=None):
        self.log_path = tempfile.mktemp(prefix="wren-serve-log-")
        self.log = open(self.log_path, "w+b")
        cmd = [WREN, "serve", "-m", model or tiny_model(), "--backend", "cpu", "--port", "0", "--ctx",
               str(ctx), "--threads", "2", "--model-name", "tiny", *args]
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT)
        self.port = None
        deadline = time.time() + 120
        while time.time() < deadline and self.port is None:
            if self.proc.poll() is not None:
                raise RuntimeError("wren serve exited at startup:\n" + self.output())
            m = re.search(r"listening on http://[^:]+:(\d+)", self.output())
            if m:
                self.port = int(m.group(1))
            else:
                time.sleep(0.05)
        if self.port is None:
            self.stop()
            raise RuntimeError("wren serve did not start:\n" + self.output())
        self.url = f"http://127.0.0.1:{self.port}"

    def output(self):
        with open(self.log_path, "rb") as f:
            return f.read().decode("utf-8", "replace")

    def alive(self):
        return self.proc.poll() is None

    def stop(self):
        """SIGTERM, then the exit status must be 0 (a clean shutdown, no sanitizer report)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                raise AssertionError("wren serve did not stop on SIGTERM:\n" + self.output())
        self.log.close()
        rc = self.proc.returncode
        assert rc == 0, f"wren serve exited with {rc}:\n{self.output()}"
        os.unlink(self.log_path)

    def client(self, **kw):
        import openai
        return openai.OpenAI(base_url=self.url + "/v1", api_key=kw.pop("api_key", "none"),
                             max_retries=0, timeout=kw.pop("timeout", 120), **kw)

    def request(self, method, path, body=None, headers=None, timeout=60):
        """(status, headers, body bytes) of one HTTP request."""
        data = body if isinstance(body, (bytes, type(None))) else json.dumps(body).encode()
        req = urllib.request.Request(self.url + path, data=data, method=method,
                                     headers=headers or {})
        if data is not None and "Content-Type" not in (headers or {}):
            req.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                return r.status, dict(r.headers), r.read()
        except urllib.error.HTTPError as e:
            return e.code, dict(e.headers), e.read()

    def metrics(self):
        status, _, body = self.request("GET", "/metrics")
        assert status == 200
        out = {}
        for line in body.decode().splitlines():
            if line and not line.startswith("#"):
                name, value = line.rsplit(" ", 1)
                out[name] = float(value)
        return out

    def sanitized(self):
        """True when the server runs under AddressSanitizer."""
        with open(f"/proc/{self.proc.pid}/maps") as f:
            return "libasan" in f.read()

    def rss_kib(self):
        with open(f"/proc/{self.proc.pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
        return 0


def model_variant(dest, generation_config):
    """The tiny model with another generation_config.json: the other files are linked."""
    src = tiny_model()
    os.makedirs(dest)
    for name in os.listdir(src):
        if name != "generation_config.json":
            os.symlink(os.path.join(src, name), os.path.join(dest, name))
    with open(os.path.join(dest, "generation_config.json"), "w") as f:
        json.dump(generation_config, f)
    return dest


def raw_http(port, data, read=True, timeout=10):
    """Sends raw bytes on a fresh connection and returns what comes back (until close)."""
    s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    try:
        s.sendall(data)
        if not read:
            return b""
        chunks = []
        while True:
            try:
                b = s.recv(65536)
            except (socket.timeout, ConnectionResetError):
                break
            if not b:
                break
            chunks.append(b)
        return b"".join(chunks)
    finally:
        s.close()


def check_error(status, body, expected_status):
    """An OpenAI error object with the expected status."""
    assert status == expected_status, (status, body[:300])
    doc = json.loads(body)
    assert isinstance(doc["error"]["message"], str) and doc["error"]["message"]
    assert isinstance(doc["error"]["type"], str)
    return doc
