"""What a served model answers is checked before a run uses it, and its key goes only where it
is meant to (issue 36, points 4, 7 and 8: the client's side).

The server here is a stand-in for a misbehaving OpenAI-compatible server (no real server can be
made to answer garbage on purpose): a small http.server on 127.0.0.1 that answers what each test
gives it and records the requests' Authorization headers. The client is the real one."""

from __future__ import annotations

import http.server
import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from rose_ray.errors import InputError
from rose_ray.inference.engine import EngineConfig, GenerationRequest
from rose_ray.inference.openai import (
    MAX_REPLY_BYTES,
    OpenAIBadAnswer,
    OpenAIEngine,
    OpenAIServerGone,
    endpoint_key,
)
from rose_ray.types import SamplingParams

GREEDY = SamplingParams(0.0, max_new_tokens=2)


@contextmanager
def answering(reply: object | bytes) -> Iterator[tuple[str, list[str | None]]]:
    """A server answering every request with `reply` (JSON, or these bytes): (its /v1 URL, the
    Authorization header of each request it got)."""
    data = reply if isinstance(reply, bytes) else json.dumps(reply).encode()  # inf/nan as Infinity/NaN
    keys: list[str | None] = []

    class Handler(Quiet):
        def answer(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            keys.append(self.headers.get("Authorization"))
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            try:
                self.wfile.write(data)
            except (BrokenPipeError, ConnectionResetError):  # a client that stopped reading
                pass

        do_GET = do_POST = answer  # noqa: N815 - http.server's names

    with serving(Handler) as url:
        yield url, keys


class Quiet(http.server.BaseHTTPRequestHandler):
    def log_message(self, *args: object) -> None:
        pass


@contextmanager
def serving(handler: type[http.server.BaseHTTPRequestHandler]) -> Iterator[str]:
    """`handler` serving on 127.0.0.1 (a thread per request): its /v1 URL."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_port}/v1"
    finally:
        server.shutdown()
        server.server_close()


def completion(token_ids: list, logprobs: list, **choice: object) -> dict:
    return {"choices": [{"text": "x", "token_ids": token_ids, "finish_reason": "length",
                         "logprobs": {"token_logprobs": logprobs}, **choice}]}


def engine(url: str, **kw: object) -> OpenAIEngine:
    return OpenAIEngine(EngineConfig.of("openai", base_url=url, retry_s=0.0, **kw))


def generate(url: str, **kw: object):
    e = engine(url, **kw)
    try:
        return e.generate([GenerationRequest([1, 2, 3], GREEDY)])
    finally:
        e.close()


@pytest.mark.parametrize(("logprob", "named"), [(float("inf"), "inf"), (float("-inf"), "-inf"),
                                                (float("nan"), "nan"), (0.5, "0.5")])
def test_a_logprob_that_is_not_finite_or_is_positive_fails_its_request(logprob, named):
    with answering(completion([5, 6], [-0.1, logprob])) as (url, _):
        with pytest.raises(OpenAIBadAnswer, match=rf"logprob {named} at choices\[0\]\.logprobs\.token_logprobs\[1\]"
                                                  ) as failed:
            generate(url)
    assert not isinstance(failed.value, OpenAIServerGone)  # the request's failure: no engine restart


def test_a_scored_logprob_that_is_not_finite_fails_its_request():
    reply = {"choices": [{"text": "", "prompt_logprobs": [None, {"2": {"logprob": -1.0}},
                                                          {"3": {"logprob": float("inf")}}]}]}
    with answering(reply) as (url, _):
        e = engine(url)
        try:
            with pytest.raises(OpenAIBadAnswer, match=r"logprob inf at choices\[0\]\.prompt_logprobs\[2\]\['3'\]"):
                e.score([1], [2, 3])
        finally:
            e.close()


def test_a_token_id_outside_the_vocabulary_fails_its_request(tiny_models):
    from rose_ray.models import load_tokenizer

    vocab = len(load_tokenizer(tiny_models["teacher"]))
    with answering(completion([5, vocab], [-0.1, -0.2])) as (url, _):
        with pytest.raises(OpenAIBadAnswer, match=rf"token id {vocab} at choices\[0\]\.token_ids\[1\]: outside the "
                                                  rf"vocabulary \[0, {vocab}\)"):
            generate(url, tokenizer=str(tiny_models["teacher"]))
    with answering(completion([-1], [-0.1])) as (url, _):
        with pytest.raises(OpenAIBadAnswer, match=r"token id -1 at choices\[0\]\.token_ids\[0\]"):
            generate(url, tokenizer=str(tiny_models["teacher"]))
    with answering(completion([5, vocab - 1], [-0.1, -0.2])) as (url, _):  # the last id is fine
        assert generate(url, tokenizer=str(tiny_models["teacher"]))[0].token_ids == [5, vocab - 1]


@pytest.mark.parametrize(("reply", "named"), [
    ({"choices": []}, r"no choices\[0\] \(its keys: \['choices'\]\)"),
    ({"object": "error"}, r"no choices \(its keys: \['object'\]\)"),
    ([1, 2], r"no choices \(it is list"),
    ({"choices": [{"token_ids": "5", "logprobs": {"token_logprobs": [-1.0]}}]},
     r"choices\[0\]\.token_ids = '5', expected a list"),
    ({"choices": [{"logprobs": {"tokens": ["hello"], "token_logprobs": [-1.0]}}]},
     r"token 'hello' at choices\[0\]\.logprobs\.tokens\[0\]"),
    (completion([5], ["-1"]), r"choices\[0\]\.logprobs\.token_logprobs\[0\] = '-1', expected a logprob"),
    (b"<html>proxy error</html>", r"the reply is not JSON .*b'<html>proxy error"),
])
def test_an_odd_reply_is_a_served_models_error_naming_the_field(reply, named):
    with answering(reply) as (url, _):
        with pytest.raises(OpenAIBadAnswer, match=named):
            generate(url)


def test_an_odd_model_list_names_the_field():
    with answering({"data": [{"name": "m"}]}) as (url, _):
        e = engine(url)
        try:
            with pytest.raises(OpenAIBadAnswer, match=r"no data\[0\]\.id"):
                e.served()
        finally:
            e.close()


def test_a_reply_past_the_cap_is_not_read():
    big = b'{"choices": [{"text": "' + b"x" * (MAX_REPLY_BYTES + 10) + b'"}]}'
    with answering(big) as (url, _):
        with pytest.raises(OpenAIBadAnswer, match=r"the reply is larger than 64 MiB"):
            generate(url)


def test_each_endpoint_gets_its_own_key(monkeypatch):
    monkeypatch.setenv("ROSE_RAY_API_KEY", "shared")
    monkeypatch.setenv("TEACHER_KEY", "teacher-only")
    reply = completion([5], [-0.5])
    with answering(reply) as (student_url, student_keys), answering(reply) as (teacher_url, teacher_keys):
        generate(teacher_url, api_key_env="TEACHER_KEY")
        generate(student_url)  # names no key: the shared one (this machine, so plain http is fine)
        generate(student_url, api_key="own")
    assert teacher_keys == ["Bearer teacher-only"]
    assert student_keys == ["Bearer shared", "Bearer own"]
    with pytest.raises(InputError, match="engine.backend.api_key_env: JUDGE_KEY is not set"):
        engine(teacher_url, api_key_env="JUDGE_KEY")


def test_the_shared_key_does_not_go_over_plain_http_to_another_host(monkeypatch, capsys):
    monkeypatch.setenv("ROSE_RAY_API_KEY", "shared")

    def key(url: str, **kw: object) -> str | None:
        return endpoint_key(EngineConfig.of("openai", base_url=url, **kw))[0]

    assert key("http://10.1.2.3:8000/v1") is None
    assert "not sending $ROSE_RAY_API_KEY over plain http to another host" in capsys.readouterr().err
    assert key("https://10.1.2.3/v1") == "shared"
    assert key("http://localhost:8000/v1") == "shared" and key("http://[::1]:8000/v1") == "shared"
    # An endpoint's own key goes where its config sends it, with a warning over plain http.
    assert key("http://10.1.2.3:8000/v1", api_key="own") == "own"
    assert "its api_key goes over plain http to another host" in capsys.readouterr().err


def test_a_commands_flag_has_its_own_key(monkeypatch, tiny_models):
    """`eval --teacher openai:URL` sends $ROSE_RAY_TEACHER_API_KEY to that URL, and the shared
    key only to a served model without one of its own."""
    from rose_ray.inference.backends import command_engine

    monkeypatch.setenv("ROSE_RAY_API_KEY", "shared")
    monkeypatch.setenv("ROSE_RAY_TEACHER_API_KEY", "teacher-only")
    reply = completion([5], [-0.5])
    with answering(reply) as (model_url, model_keys), answering(reply) as (teacher_url, teacher_keys):
        for url, flag in ((model_url, "--model"), (teacher_url, "--teacher")):
            config = command_engine(f"openai:{url}", flag, "auto", tokenizer=str(tiny_models["teacher"]), retry_s=0.0)
            e = OpenAIEngine(config)
            try:
                e.generate([GenerationRequest([1, 2, 3], GREEDY)])
            finally:
                e.close()
    assert (model_keys, teacher_keys) == (["Bearer shared"], ["Bearer teacher-only"])


@contextmanager
def redirecting(to: str | None) -> Iterator[tuple[str, list[tuple[str, str | None]]]]:
    """A server answering every request under /v1 with a 302 to `to` + its path (`to` None:
    to its own /moved/..., which it answers with a model list): (its /v1 URL, the path and
    Authorization header of each request it got)."""
    seen: list[tuple[str, str | None]] = []

    class Handler(Quiet):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            seen.append((self.path, self.headers.get("Authorization")))
            if self.path.startswith("/moved/"):
                body = json.dumps({"data": [{"id": "m"}]}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
            else:
                body = b""
                self.send_response(302)
                self.send_header("Location", (to or "/moved") + self.path.removeprefix("/v1"))
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    with serving(Handler) as url:
        yield url, seen


def test_a_redirect_to_another_origin_does_not_carry_the_key():
    """urllib sends every header on to wherever a redirect points; the key goes only to the
    origin (scheme, host, port) it was given for. `localhost` is another host than 127.0.0.1
    by name, as a server on another machine would be; another port is another origin too."""
    with answering({"data": [{"id": "m"}]}) as (url, keys):
        for elsewhere in (url.replace("127.0.0.1", "localhost"), url):
            with redirecting(elsewhere) as (redirect_url, seen):
                assert engine(redirect_url, api_key="own").models() == ["m"]
            assert seen == [("/v1/models", "Bearer own")]
    assert keys == [None, None]
    with redirecting(None) as (redirect_url, seen):  # within its own origin the key goes on
        assert engine(redirect_url, api_key="own").models() == ["m"]
    assert seen == [("/v1/models", "Bearer own"), ("/moved/models", "Bearer own")]


def test_a_request_answered_too_slowly_is_cut_off_at_its_timeout():
    """`timeout_s` bounds the whole exchange: a server that trickles its answer out (a byte now
    and then, never a wait on the socket as long as timeout_s) is cut off, not waited on for
    ever (the socket's own timeout alone never trips)."""
    stop = threading.Event()

    class Trickle(Quiet):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", "100000")
            self.end_headers()
            try:
                while not stop.wait(0.2):
                    self.wfile.write(b" ")
                    self.wfile.flush()
            except OSError:  # the client hung up
                pass

    outcome: list[BaseException] = []
    with serving(Trickle) as url:
        def ask() -> None:
            try:
                engine(url, timeout_s=1.0).models()
            except BaseException as e:  # noqa: BLE001 - what the client raised is the result
                outcome.append(e)

        t0 = time.monotonic()
        asker = threading.Thread(target=ask, daemon=True)
        asker.start()
        asker.join(timeout=20)
        waited, waiting = time.monotonic() - t0, asker.is_alive()
        stop.set()
    assert not waiting, "still waiting for an answer that trickles in, 20 s after a 1 s timeout_s"
    assert isinstance(outcome[0], OpenAIServerGone) and "no whole answer within 1 s" in str(outcome[0])
    assert waited < 6


def test_an_answer_cut_short_is_not_taken_for_one():
    """A reply that ends before its Content-Length (a server going away mid-answer) is a failed
    exchange, retried as one, not the whole JSON it happened to begin with."""
    whole = json.dumps({"data": [{"id": "m"}]}).encode()

    class Cut(Quiet):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(whole) + 100))
            self.end_headers()
            self.wfile.write(whole)
            self.close_connection = True

    with serving(Cut) as url:
        e = engine(url)
        try:
            with pytest.raises(OpenAIServerGone, match=r"no answer after 1 attempts .*cannot reach"):
                e.models()
        finally:
            e.close()


def test_a_resumed_run_keeps_the_shared_key_to_the_shared_keys_rule(monkeypatch, capsys, tmp_path):
    """A run's config.yaml holds no key: an engine's `api_key` is saved as a read of
    $ROSE_RAY_API_KEY. On --resume that key is the shared one, and keeps its rule (not over
    plain http to another host); before, it became the endpoint's own key and went anyway."""
    from rose_ray.config import load_config
    from rose_ray.runs import saved_config

    given = ["teacher_warmup.enabled=false", "teacher_engine.backend=openai", "teacher_engine.model=t",
             "teacher_engine.backend.base_url=http://10.1.2.3:8000/v1", "teacher_engine.backend.api_key=own"]
    (tmp_path / "config.yaml").write_text(saved_config(load_config(None, given)))
    assert "own" not in (tmp_path / "config.yaml").read_text()
    monkeypatch.setenv("ROSE_RAY_API_KEY", "shared")
    resumed = load_config(tmp_path / "config.yaml", []).teacher_engine
    assert resumed.backend.api_key == "shared"  # read in the driver: the engines get it with their config
    capsys.readouterr()
    assert endpoint_key(resumed) == (None, "none")
    assert "not sending $ROSE_RAY_API_KEY over plain http to another host" in capsys.readouterr().err
    https = load_config(tmp_path / "config.yaml", ["teacher_engine.backend.base_url=https://10.1.2.3/v1"])
    assert endpoint_key(https.teacher_engine) == ("shared", "$ROSE_RAY_API_KEY")
