"""The OpenAI-compatible client (rose_ray/inference/openai.py) against a small http.server on
127.0.0.1: it waits for a server that comes back and names one that does not within retry_s,
and it waits out a 429's Retry-After while other 4xx fail at once. What it checks in a
served model's answers and where its key goes: test_served_garbage.py; a served teacher that
fails its requests: test_served_teacher.py."""

from __future__ import annotations

import http.server
import json
import socket
import threading
import time

import pytest

from rose_ray.inference.engine import EngineConfig
from rose_ray.inference.openai import OpenAIEngine, OpenAIServerError, OpenAIServerGone


class JSONHandler(http.server.BaseHTTPRequestHandler):
    def answer(self, reply: object) -> None:
        body = json.dumps(reply).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def test_the_openai_client_waits_for_a_server_that_comes_back_and_names_one_that_does_not():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens here until the server below starts

    class Models(JSONHandler):
        def do_GET(self):  # noqa: N802 - http.server's name
            self.answer({"data": [{"id": "m"}]})

    url = f"http://127.0.0.1:{port}/v1"
    gone = OpenAIEngine(EngineConfig.of("openai", base_url=url, retry_s=1.0))
    t0 = time.monotonic()
    with pytest.raises(OpenAIServerGone, match=f"127.0.0.1:{port}.*no answer after 2 attempts.*retry_s 1"):
        gone.models()
    assert 0.4 < time.monotonic() - t0 < 5  # one backoff of 0.5 s, then it gave up

    servers = []

    def come_back() -> None:  # the server comes back after 1.2 s
        time.sleep(1.2)
        servers.append(http.server.HTTPServer(("127.0.0.1", port), Models))
        servers[0].serve_forever()

    starter = threading.Thread(target=come_back, daemon=True)
    starter.start()
    try:
        patient = OpenAIEngine(EngineConfig.of("openai", base_url=url, retry_s=30.0))
        assert patient.models() == ["m"]
        assert patient.stats()["retries"] >= 2  # refused at 0 s and 0.5 s, answered at 1.5 s
    finally:
        for server in servers:
            server.shutdown()
            server.server_close()
        starter.join(timeout=10)


def test_the_openai_client_waits_out_a_rate_limit():
    """A 429 (OpenAI's API under load) is retried after its Retry-After; other 4xx are not."""
    answers = [429, 429, 200]

    class Limited(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - http.server's name
            code = answers.pop(0) if answers else 400
            body = json.dumps({"data": [{"id": "m"}]} if code == 200 else {"error": {"message": f"code {code}"}})
            self.send_response(code)
            if code == 429:
                self.send_header("Retry-After", "0.3")
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body.encode())

        def log_message(self, *args):
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Limited)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        engine = OpenAIEngine(EngineConfig.of("openai", base_url=f"http://127.0.0.1:{server.server_port}/v1",
                                           retry_s=30.0))
        t0 = time.monotonic()
        assert engine.models() == ["m"]
        assert engine.stats()["retries"] == 2 and time.monotonic() - t0 >= 0.6  # waited as asked, twice
        with pytest.raises(OpenAIServerError, match="400: code 400"):  # a client error: at once
            engine.models()
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


def test_a_server_without_prompt_logprobs_is_scored_through_echo():
    """A server that leaves prompt_logprobs out of its answer (an OpenAI-compatible server other
    than vLLM's) is asked again the legacy way, echo + logprobs, and its logprobs are the score."""
    asked = []

    class Completions(JSONHandler):
        def do_POST(self):  # noqa: N802 - http.server's name
            request = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            asked.append(request)
            prompt = request["prompt"]
            logprobs = {"token_logprobs": [None] + [-0.5 * i for i in range(1, len(prompt))]}
            choice = {"text": "", "logprobs": logprobs if request.get("echo") else None}
            self.answer({"choices": [choice]})

    server = http.server.HTTPServer(("127.0.0.1", 0), Completions)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    engine = OpenAIEngine(EngineConfig.of("openai", base_url=f"http://127.0.0.1:{server.server_port}/v1"))
    try:
        assert engine.score([5, 6], [7, 8]) == [-1.0, -1.5]  # the last two of the echoed prompt's logprobs
    finally:
        engine.close()
        server.shutdown()
        server.server_close()
    assert asked[0]["prompt_logprobs"] == 0 and "echo" not in asked[0]
    assert asked[1]["echo"] is True and asked[1]["logprobs"] == 0 and "prompt_logprobs" not in asked[1]
