"""`rose-ray serve` and the openai backend, over real HTTP on localhost."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from rose_ray.inference.engine import EngineConfig, GenerationRequest
from rose_ray.inference.hf import HFEngine
from rose_ray.inference.openai import OpenAIEngine, OpenAIServerError
from rose_ray.inference.server import OpenAIServer
from rose_ray.types import SamplingParams
from tests.unit.inference.test_engine import sharpened_state

KEY = "test-key-123"


NAME = "tiny-student"


@pytest.fixture(scope="module")
def engine(tiny_models) -> HFEngine:
    eng = HFEngine(EngineConfig(model=str(tiny_models["student"]), dtype="float32", threads=1,
                                max_batch_size=8, max_wait_ms=20, context_tokens=256))
    special = tuple(eng.tokenizer.convert_tokens_to_ids(t) for t in ("<|endoftext|>", "<|im_start|>", "<|im_end|>"))
    eng.update_weights(sharpened_state(eng.model, seed=0, quiet_ids=special), 1)
    return eng


@pytest.fixture(scope="module")
def server(engine):
    with OpenAIServer(engine, NAME, api_key=KEY).start_background() as srv:
        yield srv


@pytest.fixture(scope="module")
def client(server) -> OpenAIEngine:
    return OpenAIEngine(EngineConfig.of("openai", model=NAME, base_url=server.url, api_key=KEY,
                                     context_tokens=256, max_batch_size=8))


@pytest.fixture(scope="module")
def prompt(engine) -> list[int]:
    return engine.chat.opening_ids([("user", "You are an agent."), ("assistant", "OK")]) + engine.chat.user_ids(
        "You are in the kitchen. You see a fridge.")


def post(url: str, body, key: str | None = KEY, headers: dict[str, str] | None = None) -> tuple[int, dict]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    headers = {"Content-Type": "application/json", **(headers or {})}
    if key is not None:
        headers["Authorization"] = f"Bearer {key}"
    try:
        with urllib.request.urlopen(urllib.request.Request(url, data=data, headers=headers), timeout=60) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def test_client_generate_round_trips_exact_token_ids(engine, client, prompt):
    sampling = SamplingParams(temperature=1.0, top_p=0.95, max_new_tokens=20, seed=11)
    remote = client.generate([GenerationRequest(prompt, sampling, request_id="r1", top_logprobs=3)])[0]
    local = engine.generate([GenerationRequest(prompt, sampling, top_logprobs=3)])[0]
    assert remote.token_ids == local.token_ids and len(remote.token_ids) > 0
    np.testing.assert_allclose(remote.logprobs, local.logprobs, atol=1e-5)
    assert remote.text == local.text and remote.finish_reason == local.finish_reason
    assert remote.request_id == "r1" and remote.prompt_tokens == len(prompt)
    assert [sorted(d) for d in remote.top_logprobs] == [sorted(d) for d in local.top_logprobs]


def test_client_score_matches_the_engine(engine, client, prompt):
    completion = engine.generate([GenerationRequest(prompt, SamplingParams(1.0, 1.0, 12, [], 4))])[0].token_ids
    remote = client.score(prompt, completion)
    np.testing.assert_allclose(remote, engine.score(prompt, completion), atol=1e-5)
    many = client.score_many([(prompt, completion), (prompt[:5], prompt[5:9])])
    np.testing.assert_allclose(many[1], engine.score(prompt[:5], prompt[5:9]), atol=1e-5)


def test_echo_logprobs_score_the_prompt(server, engine, prompt):
    status, out = post(server.url + "/completions", {"model": NAME, "prompt": prompt, "max_tokens": 0,
                                                     "echo": True, "logprobs": 0,
                                                     "return_tokens_as_token_ids": True})
    assert status == 200
    lp = out["choices"][0]["logprobs"]
    assert lp["tokens"] == [f"token_id:{t}" for t in prompt]
    assert lp["token_logprobs"][0] is None
    np.testing.assert_allclose(lp["token_logprobs"][1:], engine.score(prompt[:1], prompt[1:]), atol=1e-5)
    assert out["choices"][0]["prompt_token_ids"] == prompt and out["usage"]["completion_tokens"] == 0


def test_text_completion_and_several_prompts(server, engine):
    status, out = post(server.url + "/completions", {"prompt": ["look around", "open door"], "max_tokens": 5,
                                                     "temperature": 0, "logprobs": 2})
    assert status == 200 and [c["index"] for c in out["choices"]] == [0, 1]
    for text, choice in zip(["look around", "open door"], out["choices"]):
        ids = engine.chat.encode(text)
        local = engine.generate([GenerationRequest(ids, SamplingParams(0.0, 1.0, 5))])[0]
        assert choice["token_ids"] == local.token_ids and choice["text"] == local.text
        assert len(choice["logprobs"]["top_logprobs"][0]) == 2


def test_chat_completion_uses_the_chat_template(server, engine):
    messages = [{"role": "user", "content": "Hello"}, {"role": "assistant", "content": "OK"},
                {"role": "user", "content": [{"type": "text", "text": "look around"}]}]
    status, out = post(server.url + "/chat/completions", {
        "model": NAME, "messages": messages, "max_tokens": 8, "temperature": 0, "logprobs": True,
        "top_logprobs": 2, "return_tokens_as_token_ids": True})
    assert status == 200
    flat = [{"role": m["role"], "content": m["content"] if isinstance(m["content"], str) else "look around"}
            for m in messages]
    ids = engine.chat.render_ids(flat, add_generation_prompt=True)
    local = engine.generate([GenerationRequest(ids, SamplingParams(0.0, 1.0, 8))])[0]
    choice = out["choices"][0]
    assert out["prompt_token_ids"] == ids
    assert choice["token_ids"] == local.token_ids and choice["message"]["content"] == local.text
    content = choice["logprobs"]["content"]
    assert [c["token"] for c in content] == [f"token_id:{t}" for t in local.token_ids]
    np.testing.assert_allclose([c["logprob"] for c in content], local.logprobs, atol=1e-5)
    assert all(len(c["top_logprobs"]) == 2 for c in content)


def test_wrong_or_missing_key_is_401(server, engine):
    body = {"model": NAME, "prompt": "look", "max_tokens": 2}
    for key in ("wrong", None):
        status, out = post(server.url + "/completions", body, key=key)
        assert status == 401 and "API key" in out["error"]["message"]
    bad = OpenAIEngine(EngineConfig.of("openai", model=NAME, base_url=server.url, api_key="wrong"))
    with pytest.raises(OpenAIServerError) as e:
        bad.generate([GenerationRequest([1, 2, 3], SamplingParams(max_new_tokens=2))])
    assert e.value.status == 401
    with urllib.request.urlopen(server.url.removesuffix("/v1") + "/health", timeout=10) as r:
        assert json.loads(r.read())["status"] == "ok"  # health needs no key


@pytest.mark.parametrize(
    "body, param, words",
    [
        (b"{not json", None, "not valid JSON"),
        (b"[1, 2]", None, "JSON object"),
        ({"model": NAME}, "prompt", "'prompt' is required"),
        ({"prompt": "x", "temperature": "hot"}, "temperature", "'temperature' must be a number"),
        ({"prompt": "x", "top_p": 1.5}, "top_p", "'top_p' must be between"),
        ({"prompt": [1, 2, 10**9]}, "prompt", "not a token id"),
        ({"prompt": "x", "stream": True}, "stream", "not supported"),
        ({"prompt": "x", "n": 2}, "n", "'n' must be between"),
        ({"prompt": "x", "stop": [""]}, "stop", "'stop' must be"),
        ({"prompt": [5] * 250, "max_tokens": 10}, "max_tokens", "maximum context length is 256"),
        ({"prompt": "x", "stream": "yes"}, "stream", "'stream' must be true or false"),
        (b'{"prompt": "x", "temperature": NaN}', None, "NaN is not a JSON number"),
        (b'{"prompt": "x", "temperature": 1e999}', None, "1e999 is out of range"),
        (b"[" * 50_000 + b"]" * 50_000, None, "nested too deeply"),
        (b'{"prompt": "x", "seed": 1' + b"0" * 5000 + b"}", None, "not valid JSON"),
        (b'{"prompt": "\xff\xfe"}', None, "not valid JSON"),
        ({"prompt": "x", "seed": 2**64}, "seed", "'seed' must be an integer in"),
        ({"prompt": [[5, 6]] * 17}, "prompt", "at most 16 per request"),
        ({"prompt": "x", "stop": ["y" * 256] * 16}, None, None),  # fine: the most stop strings, each at its longest
        ({"prompt": "x", "stop": ["y" * 10_000]}, "stop", "at most 256 each"),
        ({"prompt": "x", "stop": "y" * 257}, "stop", "a string of 257 characters"),
        ({"prompt": "x", "stop": ["y"] * 10**5}, "stop", "'stop' holds 100,000 strings; at most 16"),
    ],
    ids=lambda v: repr(v)[:48] if isinstance(v, (bytes, dict)) else None,
)
def test_malformed_requests_are_400_with_a_readable_message(server, body, param, words):
    status, out = post(server.url + "/completions", body)
    if words is None:
        assert status == 200, out
        return
    assert status == 400
    assert words in out["error"]["message"] and out["error"]["param"] == param
    assert len(out["error"]["message"]) < 400  # a bad value is quoted, not echoed whole


def test_long_bad_values_are_cut_in_the_message(server):
    status, out = post(server.url + "/chat/completions", {"messages": [{"role": "robot", "content": "z" * 10**6}]})
    assert status == 400 and "messages[0]" in out["error"]["message"]
    assert "characters)" in out["error"]["message"] and len(out["error"]["message"]) < 400


def test_vanishing_temperature_is_greedy(server):
    """As in vLLM: a temperature under 1e-5 decodes greedily (dividing by it would give NaN)."""
    body = {"prompt": "look around", "max_tokens": 6, "seed": 3}
    tiny = post(server.url + "/completions", {**body, "temperature": 1e-30})
    greedy = post(server.url + "/completions", {**body, "temperature": 0})
    assert tiny[0] == greedy[0] == 200
    assert tiny[1]["choices"][0]["token_ids"] == greedy[1]["choices"][0]["token_ids"]


def test_unknown_routes_and_methods_name_the_endpoints(server):
    status, out = post(server.url + "/embeddings", {"input": "x"})
    assert status == 404 and "POST /v1/embeddings" in out["error"]["message"]
    assert "/v1/chat/completions" in out["error"]["message"]
    try:
        urllib.request.urlopen(urllib.request.Request(server.url + "/completions",
                                                      headers={"Authorization": f"Bearer {KEY}"}), timeout=10)
        raise AssertionError("GET /v1/completions was answered")
    except urllib.error.HTTPError as e:
        assert e.code == 405 and "GET is not allowed" in json.loads(e.read())["error"]["message"]


def test_a_template_refusal_is_a_400(monkeypatch):
    from jinja2.exceptions import TemplateError

    from rose_ray.inference.protocol import RequestError, parse_chat

    class Refusing:
        def render_ids(self, *a, **k):
            raise TemplateError("No user query found in messages.")

    with pytest.raises(RequestError, match="chat template refused these messages: No user query") as e:
        parse_chat({"messages": [{"role": "system", "content": "x"}]}, Refusing(), 256)
    assert e.value.status == 400 and e.value.param == "messages"


def test_chat_errors_and_unknown_model(server):
    status, out = post(server.url + "/chat/completions", {"messages": [{"role": "robot", "content": "x"}]})
    assert status == 400 and "messages[0]" in out["error"]["message"]
    status, out = post(server.url + "/completions", {"model": "gpt-9", "prompt": "x"})
    assert status == 404 and "gpt-9" in out["error"]["message"]


def test_client_error_carries_the_server_message(client):
    with pytest.raises(OpenAIServerError, match="not a token id"):
        client.generate([GenerationRequest([10**9], SamplingParams(max_new_tokens=2))])
    with pytest.raises(NotImplementedError, match="frozen"):
        client.update_weights({}, 1)


def test_client_sends_the_prompt_ids_as_given(client, engine):
    """A served engine cuts nothing (the rollout did): a prompt without room in the context
    gets finish "context" without a request; one with room is sent whole, as ids."""
    prompt = engine.chat.user_ids("observation " * 400)
    assert len(prompt) >= 256
    res = client.generate([GenerationRequest(prompt, SamplingParams(0.0, 1.0, 16))])[0]
    assert res.finish_reason == "context" and res.token_ids == [] and res.prompt_tokens == len(prompt)
    short = prompt[: 256 - 16]
    res = client.generate([GenerationRequest(short, SamplingParams(0.0, 1.0, 16))])[0]
    assert res.finish_reason in ("stop", "length") and res.prompt_tokens == len(short)


def test_concurrent_http_requests_are_batched(client, engine, prompt):
    before = len(engine.stats()["batch_sizes"])
    reqs = [GenerationRequest(prompt + [i + 10], SamplingParams(0.0, 1.0, 6)) for i in range(8)]
    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(lambda r: client.generate([r])[0], reqs))
    sizes = engine.stats()["batch_sizes"][before:]
    assert sum(sizes) == 8 and max(sizes) > 1, sizes
    assert [r.token_ids for r in results] == [r.token_ids for r in engine.generate(reqs)]


def test_a_body_that_is_not_json_by_its_content_type_is_415(server):
    # A web page can POST text/plain anywhere without a CORS preflight; JSON it cannot.
    body = json.dumps({"model": NAME, "prompt": "look", "max_tokens": 2}).encode()
    for kind in ("text/plain", "application/x-www-form-urlencoded", None):
        headers = {"Authorization": f"Bearer {KEY}", **({"Content-Type": kind} if kind else {})}
        req = urllib.request.Request(server.url + "/completions", data=body, headers=headers)
        if kind is None:
            req.remove_header("Content-type")  # urllib adds form-urlencoded itself otherwise
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(req, timeout=60)
        assert e.value.code == 415, kind
        assert "Content-Type: application/json" in json.loads(e.value.read())["error"]["message"]
    assert post(server.url + "/completions", {"prompt": "look", "max_tokens": 2},
                headers={"Content-Type": "application/json; charset=utf-8"})[0] == 200


def test_a_server_without_a_key_answers_only_ip_or_localhost_hosts(engine, server):
    # DNS rebinding: a page at http://evil.example:PORT whose name now resolves to 127.0.0.1
    # reaches the server with that Host; an address or localhost is what local clients send.
    with OpenAIServer(engine, NAME).start_background() as srv:
        body = {"prompt": "look", "max_tokens": 1}
        for host in ("evil.example", f"evil.example:{srv.port}", f"rebind.127.0.0.1.nip.io:{srv.port}"):
            status, out = post(srv.url + "/completions", body, key=None, headers={"Host": host})
            assert status == 403 and "no API key" in out["error"]["message"], host
        for host in (f"127.0.0.1:{srv.port}", f"localhost:{srv.port}", "localhost", f"[::1]:{srv.port}",
                     f"10.1.2.3:{srv.port}"):
            assert post(srv.url + "/completions", body, key=None, headers={"Host": host})[0] == 200, host
    assert srv._loop.is_closed()  # stopped, the server's event loop is closed (its selector's sockets)
    # With a key any name is fine (the key is what admits a client).
    assert post(server.url + "/completions", body, headers={"Host": "teacher.cluster.example"})[0] == 200


def test_requests_past_max_concurrent_get_429_and_a_body_that_never_arrives_408(engine):
    import socket

    with OpenAIServer(engine, NAME, api_key=KEY, max_concurrent=2, read_timeout_s=3).start_background() as srv:
        head = (f"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1:{srv.port}\r\nContent-Type: application/json\r\n"
                f"Authorization: Bearer {KEY}\r\nContent-Length: 100\r\n\r\n{{\"prompt\":").encode()
        slow = [socket.create_connection(("127.0.0.1", srv.port), timeout=30) for _ in range(2)]
        try:
            for s in slow:  # each holds a place: its body is still on the way
                s.sendall(head)
            time.sleep(0.5)
            status, out = post(srv.url + "/completions", {"prompt": "look", "max_tokens": 1})
            assert status == 429 and "max_concurrent 2" in out["error"]["message"]
            for s in slow:  # the read timeout frees them
                assert s.recv(65536).split(b" ", 2)[1] == b"408"
        finally:
            for s in slow:
                s.close()
        assert post(srv.url + "/completions", {"prompt": "look", "max_tokens": 1})[0] == 200


def test_serve_on_vllm_names_vllms_own_server(tiny_models, capsys, monkeypatch):
    """`serve --backend vllm` starts nothing: vLLM serves with its own server (the one
    tests/integration/test_vllm_server.py starts from these words), named with the settings given and
    without the key's value; exit 2."""
    from rose_ray.cli import main

    monkeypatch.setenv("ROSE_RAY_API_KEY", "secret-key")
    model = str(tiny_models["teacher"])
    assert main(["serve", model, "--backend", "vllm", "--port", "8123", "--served-model-name", "teacher",
                 "--context-tokens", "4096"]) == 2
    err = capsys.readouterr().err
    assert (f"rose-ray serve: error: --backend vllm: serve the model with vLLM's own OpenAI server, which the openai "
            f"engine talks to as it does to this one: python -m vllm.entrypoints.openai.api_server --model {model} "
            "--served-model-name teacher --host 127.0.0.1 --port 8123 --max-model-len 4096 --dtype auto --api-key KEY"
            in err), err
    assert "secret-key" not in err
