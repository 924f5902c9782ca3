"""A served teacher, against `rose-ray serve` (a subprocess on 127.0.0.1): checked before a run
(`rose-ray check`, `train`, and the one-off commands with openai: models); and a request that
always fails is not a dead server (issue 27, point 3).

The served teacher here is a real misconfiguration: a model folder whose tokenizer has one
token more than the model has embeddings ("animal", added after the model was saved). The
server takes that id (its tokenizer knows it) and its engine fails on it: a 500 for every
request whose prompt holds the word, while every other request is answered. The client tells
that request's own failure from a server that is down (`OpenAIRequestFailed`, in seconds, not
after retry_s); a training run fails only those episodes (`failed` in episodes.jsonl, with the
server's message), restarts no engine, and trains on the rest. A server that fails everything
is still taken for gone, and a server going away fails its requests in flight fast."""

from __future__ import annotations

import http.server
import threading
import time

import pytest

from rose_ray.inference.engine import EngineConfig, GenerationRequest
from rose_ray.inference.openai import OpenAIEngine, OpenAIServerGone
from rose_ray.types import SamplingParams
from tests.served import json_server


def test_a_server_that_fails_every_request_is_taken_for_gone():
    broken, url = json_server(500, {"error": {"message": "engine dead"}})
    engine = OpenAIEngine(EngineConfig.of("openai", base_url=url, retry_s=2.0))
    try:
        with pytest.raises(OpenAIServerGone, match="no answer after .* 500: engine dead"):
            engine.generate([GenerationRequest([1, 2, 3], SamplingParams(0.0, max_new_tokens=2))])
    finally:
        engine.close()
        broken.shutdown()
        broken.server_close()


def test_a_server_going_away_cuts_off_its_requests_in_flight():
    """A server that stops taking connections and leaves a request unanswered (as vLLM's does on
    SIGTERM: tests/integration/test_vllm_server.py) fails that request within seconds, not after timeout_s."""
    answer = threading.Event()

    class Silent(http.server.BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802 - http.server's name
            answer.wait(120)  # never answers while the test runs

        def log_message(self, *args):
            pass

    going = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Silent)
    threading.Thread(target=going.serve_forever, daemon=True).start()
    engine = OpenAIEngine(EngineConfig.of("openai", base_url=f"http://127.0.0.1:{going.server_port}/v1",
                                       retry_s=2.0, timeout_s=600.0))
    outcome: dict = {}

    def ask() -> None:
        try:
            outcome["result"] = engine.generate([GenerationRequest([1, 2, 3], SamplingParams(0.0, max_new_tokens=2))])
        except Exception as e:  # noqa: BLE001 - what the test looks at
            outcome["error"] = e

    thread = threading.Thread(target=ask)
    thread.start()
    time.sleep(3.0)  # the request is out, unanswered, and the server still takes connections
    assert thread.is_alive() and engine.stats()["cut_off"] == 0
    going.shutdown()
    going.socket.close()  # no new connections; the request in flight stays open, unanswered
    closed_at = time.monotonic()
    thread.join(timeout=60)
    waited = time.monotonic() - closed_at
    answer.set()
    engine.close()
    assert not thread.is_alive(), "the request still waits for the server that went away"
    assert isinstance(outcome.get("error"), OpenAIServerGone), outcome
    assert "stopped taking connections" in str(outcome["error"]) or "cannot reach" in str(outcome["error"])
    assert waited < 15 and engine.stats()["cut_off"] == 1, (waited, engine.stats())


def test_an_answer_that_comes_while_its_server_is_probed_is_returned_then(monkeypatch):
    """A request out longer than LIVENESS_S has its server probed (a TCP connect); an answer that
    comes while the probe is still out is returned then, not once the probe ends. A slow connect
    (a far or congested host) cannot be made on loopback, so the engine's own probe is held 20 s
    here before it runs."""
    import asyncio
    import json

    from rose_ray.inference.openai import LIVENESS_S
    from tests.unit.inference.test_served_garbage import Quiet, completion, serving

    reply = json.dumps(completion([5, 6], [-0.1, -0.2])).encode()

    class Late(Quiet):
        def do_POST(self):  # noqa: N802 - http.server's name
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            time.sleep(LIVENESS_S + 0.5)  # out long enough to be probed
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(reply)))
            self.end_headers()
            self.wfile.write(reply)

    with serving(Late) as url:
        engine = OpenAIEngine(EngineConfig.of("openai", base_url=url, retry_s=0.0, timeout_s=120.0))
        probe = engine._unreachable

        async def slow_probe() -> str | None:
            await asyncio.sleep(20)
            return await probe()

        monkeypatch.setattr(engine, "_unreachable", slow_probe)
        start = time.monotonic()
        try:
            [result] = engine.generate([GenerationRequest([1, 2, 3], SamplingParams(0.0, max_new_tokens=2))])
        finally:
            engine.close()
    took = time.monotonic() - start
    assert result.token_ids == [5, 6]
    assert took < 12, f"the answer waited {took:.1f} s, for the probe (answered after {LIVENESS_S + 0.5:g} s)"
