"""The half of tests/unit/inference/test_serve_load.py whose tests start processes
(Ray, JVMs, servers or commands); that file's docstring says what both halves check."""

from __future__ import annotations

import http.client
import json
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from rose_ray.inference.protocol import MAX_PROMPTS, max_body_bytes

KEY = "load-key"
NAME = "tiny-student"
CONTEXT = 256
HOST = "127.0.0.1"
MESSAGES = [{"role": "user", "content": "You are an agent."}, {"role": "assistant", "content": "OK"},
            {"role": "user", "content": "You are in the kitchen. You see a fridge."}]


@dataclass
class Served:
    port: int
    proc: subprocess.Popen
    log: Path


def call(port: int, path: str, body: Any = None, key: str | None = KEY, method: str = "POST",
         headers: dict[str, str] | None = None) -> tuple[int, dict[str, Any]]:
    """One request on its own connection: (status, JSON answer). A dict body is sent as JSON."""
    data = json.dumps(body).encode() if isinstance(body, (dict, list)) else body
    hdrs = {"Content-Type": "application/json", **({"Authorization": f"Bearer {key}"} if key else {}),
            **(headers or {})}
    conn = http.client.HTTPConnection(HOST, port, timeout=60)
    try:
        conn.request(method, path, body=data, headers=hdrs)  # an iterator body goes chunked
        resp = conn.getresponse()
        return resp.status, json.loads(resp.read())
    finally:
        conn.close()


def raw_request(path: str, body: bytes, length: int | None = None) -> bytes:
    head = (f"POST {path} HTTP/1.1\r\nHost: {HOST}\r\nContent-Type: application/json\r\n"
            f"Authorization: Bearer {KEY}\r\nContent-Length: {len(body) if length is None else length}\r\n")
    return head.encode() + b"\r\n" + body


def hang_up(port: int, data: bytes, pause_s: float = 0.0, reset: bool = False) -> None:
    """Send `data`, then close without reading a byte (with RST when `reset`)."""
    with socket.create_connection((HOST, port), timeout=10) as s:
        s.sendall(data)
        time.sleep(pause_s)
        if reset:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))


def status_line(port: int, data: bytes) -> int:
    """The status code a raw byte string gets back."""
    with socket.create_connection((HOST, port), timeout=30) as s:
        s.sendall(data)
        answer = b""
        while b"\r\n" not in answer and (chunk := s.recv(65536)):
            answer += chunk
    return int(answer.split(b" ", 2)[1])


def greedy(port: int, text: str, max_tokens: int = 6) -> list[int]:
    status, out = call(port, "/v1/completions", {"model": NAME, "prompt": text, "max_tokens": max_tokens,
                                                 "temperature": 0})
    assert status == 200, out
    return out["choices"][0]["token_ids"]


@pytest.fixture(scope="module")
def served(tiny_models, tmp_path_factory) -> Iterator[Served]:
    with socket.socket() as s:
        s.bind((HOST, 0))
        port = s.getsockname()[1]
    log = tmp_path_factory.mktemp("serve") / "server.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "rose_ray.cli", "serve", str(tiny_models["student"]), "--port", str(port),
             "--api-key", KEY, "--served-model-name", NAME, "--threads", "1", "--dtype", "float32",
             "--context-tokens", str(CONTEXT), "--max-batch-size", "8"],
            stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.time() + 120
        while True:
            try:
                if call(port, "/health", method="GET")[0] == 200:
                    break
            except OSError:
                assert proc.poll() is None, log.read_text()
                assert time.time() < deadline, "the server did not come up"
                time.sleep(0.3)
        yield Served(port, proc, log)
    finally:
        proc.terminate()
        proc.wait(timeout=30)


@pytest.fixture(scope="module")
def reference(served) -> list[int]:
    """A greedy reply taken before any bad input: the same request must give it afterwards."""
    return greedy(served.port, "look around")


def test_the_largest_valid_request_is_served(served):
    """MAX_PROMPTS prompts that fill the context pass the body limit and are answered."""
    body = {"model": NAME, "prompt": [[1000] * (CONTEXT - 1)] * MAX_PROMPTS, "max_tokens": 1, "temperature": 0}
    status, out = call(served.port, "/v1/completions", body)
    assert status == 200 and len(out["choices"]) == MAX_PROMPTS, out


BAD = [
    ("malformed JSON", "/v1/completions", b'{"prompt": [1, 2', KEY, 400, "not valid JSON"),
    ("a bare number", "/v1/chat/completions", b"42", KEY, 400, "must be a JSON object"),
    ("oversize", "/v1/completions", "oversize", KEY, 413, "this server takes at most"),
    ("oversize, chunked", "/v1/completions", "chunked", KEY, 413, "this server takes at most"),
    ("wrong key", "/v1/completions", {"prompt": "x"}, "nope", 401, "invalid or missing API key"),
    ("no key", "/v1/chat/completions", {"messages": MESSAGES}, None, 401, "invalid or missing API key"),
    ("stream, chat", "/v1/chat/completions", {"messages": MESSAGES, "stream": True}, KEY, 400,
     "'stream': true is not supported"),
    ("stream, completion", "/v1/completions", {"prompt": "x", "stream": True}, KEY, 400,
     "'stream': true is not supported"),
    ("unknown route", "/v1/embeddings", {"input": "x"}, KEY, 404, "no endpoint POST /v1/embeddings"),
]


@pytest.mark.parametrize("name, path, body, key, status, words", BAD, ids=[b[0] for b in BAD])
def test_bad_requests_get_their_4xx_and_good_ones_pass_in_between(served, reference, name, path, body,
                                                                    key, status, words):
    limit = max_body_bytes(CONTEXT)
    if body == "oversize":
        body = b'{"prompt": "' + b"a" * limit + b'"}'
    elif body == "chunked":  # no Content-Length: counted while read
        body = iter([b'{"prompt": "'] + [b"a" * 2**16] * (limit // 2**16 + 1) + [b'"}'])
    got, out = call(served.port, path, body, key=key)
    assert got == status and words in out["error"]["message"], out
    if status == 413:
        assert f"{limit:,} bytes" in out["error"]["message"]
    assert greedy(served.port, "look around") == reference


def test_a_huge_text_prompt_does_not_hold_up_other_clients(served):
    """Tokenizing the largest body takes about a second; it runs off the event loop, so a small
    request sent meanwhile is answered first."""
    text = ("You see a fridge. " * max_body_bytes(CONTEXT))[: max_body_bytes(CONTEXT) - 100]
    big: dict[str, Any] = {}

    def send_big() -> None:
        big["answer"] = call(served.port, "/v1/completions", {"prompt": text, "max_tokens": 1})
        big["at"] = time.perf_counter()

    thread = threading.Thread(target=send_big)
    thread.start()
    time.sleep(0.3)  # its body is in and being tokenized
    assert len(greedy(served.port, "look around", 2)) == 2
    small_at = time.perf_counter()
    thread.join()
    status, out = big["answer"]
    assert status == 400 and "maximum context length is 256" in out["error"]["message"]
    assert small_at < big["at"]


def test_http_level_garbage_gets_4xx(served, reference):
    assert status_line(served.port, b"\x00\x01 nonsense \x02\r\n\r\n") == 400
    # An Authorization header that is not UTF-8 is a wrong key, not a server error.
    body = json.dumps({"prompt": "x", "max_tokens": 1}).encode()
    bad_header = raw_request("/v1/completions", body).replace(f"Bearer {KEY}".encode(), b"Bearer \xff\xfe")
    assert status_line(served.port, bad_header) == 401
    assert greedy(served.port, "look around") == reference


def test_clients_that_hang_up_do_not_stop_the_server(served, reference):
    port = served.port
    body = json.dumps({"model": NAME, "prompt": "open the door", "max_tokens": 32, "temperature": 1.0}).encode()
    hangups = (
        [threading.Thread(target=hang_up, args=(port, raw_request("/v1/completions", body))) for _ in range(6)]
        # says 10,000 bytes, sends a few and leaves
        + [threading.Thread(target=hang_up, args=(port, raw_request("/v1/completions", b'{"prompt"', 10_000)))
           for _ in range(3)]
        # resets the connection while its request is being generated
        + [threading.Thread(target=hang_up, args=(port, raw_request("/v1/completions", body), 0.05, True))
           for _ in range(3)]
    )
    for t in hangups:
        t.start()
    with ThreadPoolExecutor(8) as pool:  # meanwhile, other clients are served
        replies = list(pool.map(lambda i: greedy(port, f"look at the table {i}", 4), range(8)))
    for t in hangups:
        t.join()
    assert all(len(r) == 4 for r in replies)
    t0 = time.perf_counter()
    assert greedy(port, "look around") == reference  # the batcher is neither stuck nor changed
    assert time.perf_counter() - t0 < 20
    assert served.proc.poll() is None and call(port, "/health", method="GET")[0] == 200


def test_the_openai_client_is_served_and_told_no_streaming(served):
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url=f"http://{HOST}:{served.port}/v1", api_key=KEY, max_retries=0, timeout=60)
    chat = client.chat.completions.create(model=NAME, messages=MESSAGES, max_tokens=4, temperature=0)
    assert isinstance(chat.choices[0].message.content, str) and chat.usage.completion_tokens <= 4
    for create in (lambda: client.chat.completions.create(model=NAME, messages=MESSAGES, max_tokens=4, stream=True),
                   lambda: client.completions.create(model=NAME, prompt="look", max_tokens=4, stream=True)):
        with pytest.raises(openai.BadRequestError) as e:
            for _ in create():
                pass
        assert e.value.status_code == 400 and "'stream': true is not supported" in e.value.message
    wrong = openai.OpenAI(base_url=f"http://{HOST}:{served.port}/v1", api_key="nope", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        wrong.completions.create(model=NAME, prompt="look", max_tokens=2)


def test_mixed_load_answers_each_request_right(served):
    """16 clients at once, half of them bad: each gets its own answer, good ones their tokens."""
    port = served.port
    texts = [f"go to the kitchen {i}" for i in range(24)]
    expected = [greedy(port, t, 5) for t in texts]  # one at a time first
    limit = max_body_bytes(CONTEXT)
    bad: list[tuple[Any, str | None, int | None]] = [
        (b'{"prompt": ', KEY, 400), ({"prompt": "x"}, "nope", 401), ({"prompt": "x", "stream": True}, KEY, 400),
        (b'{"prompt": "' + b"z" * limit + b'"}', KEY, 413), ("hang up", KEY, None),
        ({"prompt": "x", "temperature": "hot"}, KEY, 400),
    ]

    def one(i: int) -> tuple[Any, Any]:
        if i % 2 == 0:
            return greedy(port, texts[i // 2], 5), expected[i // 2]
        body, key, status = bad[(i // 2) % len(bad)]
        if status is None:
            hang_up(port, raw_request("/v1/completions", json.dumps({"prompt": "x", "max_tokens": 16}).encode()))
            return None, None
        return call(port, "/v1/completions", body, key=key)[0], status

    with ThreadPoolExecutor(16) as pool:
        results = list(pool.map(one, range(48)))
    assert [got for got, _ in results] == [want for _, want in results]
    assert served.proc.poll() is None


def test_the_server_is_up_and_logged_no_traceback(served, reference):
    """Last: after everything above, still up, same answers, and nothing went wrong inside."""
    assert served.proc.poll() is None
    assert greedy(served.port, "look around") == reference
    log = served.log.read_text(errors="replace")
    assert "Traceback" not in log and "Error handling request" not in log, log[-3000:]
