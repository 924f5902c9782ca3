"""vLLM's own OpenAI server as a teacher: `python -m vllm.entrypoints.openai.api_server` on
127.0.0.1 with a tiny teacher (CPU), started once for this module.

Through the server, greedy ids, sampled-token logprobs and OPD scores (prompt logprobs) agree
with the in-process vllm engine; `rose-ray eval` with the served teacher and a short OPD run
against it work; a served model that does not fit (its name, its context) stops eval and
train at once with exit 2 naming the flag or key; and a server stopped gracefully (SIGTERM:
it takes no new connections, and leaves requests in flight unanswered) fails them fast.
The last test stops the server."""

from __future__ import annotations

import json
import os
import re
import signal
import sys
import threading
import time
from pathlib import Path

import pytest

from rose_ray.cli import main
from rose_ray.commands import ServeCommand
from rose_ray.inference.engine import EngineConfig, GenerationRequest
from rose_ray.inference.openai import OpenAIEngine, OpenAIServerError, OpenAIServerGone
from rose_ray.inference.server import vllm_server
from rose_ray.types import SamplingParams
from tests.served import Served, free_port, start_server

pytest.importorskip("vllm", reason="vLLM's server needs vLLM (launch/setup.sh installs it)")


NAME = "tiny-teacher"


CONTEXT = 2048


# Beside what `rose-ray serve --backend vllm` names (inference.server.vllm_server): this CPU's settings.
SERVER_FLAGS = ["--enforce-eager", "--seed", "0", "--kv-cache-memory-bytes", str(256 << 20), "--max-num-seqs", "8",
                "--disable-log-stats", "--uvicorn-log-level", "warning"]


@pytest.fixture(scope="module")
def teacher_dir(tiny_models, tmp_path_factory) -> Path:
    """The tiny teacher with sharpened weights: its outputs depend on the prompt (at init scale
    greedy decoding repeats one token whatever it is given, and agreement would say little)."""
    from rose_ray.models import load_model, load_tokenizer
    from tests.unit.inference.test_engine import sharpened_state, special_ids

    out = tmp_path_factory.mktemp("sharp") / "teacher"
    model, tok = load_model(tiny_models["teacher"]), load_tokenizer(tiny_models["teacher"])
    model.load_state_dict(sharpened_state(model, seed=1, quiet_ids=special_ids(tok)), strict=False)
    model.save_pretrained(out, safe_serialization=True)
    tok.save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def server(teacher_dir, tmp_path_factory) -> Served:
    port = free_port()
    # As a user starts it: the engine core in its own process (a test process that ran vLLM
    # in-process has VLLM_ENABLE_V1_MULTIPROCESSING=0 set), threads not pinned to cores.
    env = {k: v for k, v in os.environ.items() if k != "VLLM_ENABLE_V1_MULTIPROCESSING"}
    # One thread, as the in-process engine it is compared with: kernels reduce in another order
    # with another thread count (logprobs then differ by ~2e-5).
    env.update(VLLM_CPU_OMP_THREADS_BIND="nobind", OMP_NUM_THREADS="1", VLLM_NO_USAGE_STATS="1",
               VLLM_DO_NOT_TRACK="1")
    # The server `rose-ray serve --backend vllm` tells the user to start.
    named = vllm_server(ServeCommand(model=str(teacher_dir), backend="vllm", port=port, served_model_name=NAME,
                                     context_tokens=CONTEXT, dtype="float32"))
    assert named[:3] == ["python", "-m", "vllm.entrypoints.openai.api_server"]
    cmd = [sys.executable, *named[1:], *SERVER_FLAGS]
    t0 = time.monotonic()
    srv = start_server(cmd, tmp_path_factory.mktemp("vllm") / "server.log", env, port)
    print(f"vLLM's server up in {time.monotonic() - t0:.0f} s")
    yield srv
    srv.stop()
    assert not [pid for pid in srv.children() if _alive(pid)]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False


def client(server: Served, teacher_dir: Path, **overrides) -> OpenAIEngine:
    return OpenAIEngine(EngineConfig.of("openai", base_url=server.url, model=NAME, tokenizer=str(teacher_dir),
                                     context_tokens=CONTEXT, max_batch_size=8, **overrides))


@pytest.mark.slow
def test_the_server_lists_its_model_and_context(server):
    (model,) = server.models()["data"]
    assert model["id"] == NAME and model["max_model_len"] == CONTEXT


@pytest.mark.slow
def test_greedy_ids_logprobs_and_scores_agree_with_the_in_process_engine(server, teacher_dir):
    from rose_ray.chat import ChatFormat
    from rose_ray.inference.vllm_engine import VLLMEngine
    from rose_ray.models import load_tokenizer

    chat = ChatFormat(load_tokenizer(teacher_dir))
    opening = chat.opening_ids([("user", "You are an agent in a science world."), ("assistant", "OK")])
    rooms = ["the kitchen. You see a fridge", "a greenhouse with a bee hive, a jug and three flower pots " * 8,
             "the hallway. A door to the art studio is open", "the workshop. You see a battery, a wire and a bulb"]
    prompts = [opening + chat.user_ids(f"You are in {room}.") for room in rooms]
    assert max(len(p) for p in prompts) > 128  # longer than a KV block: prefix reuse would show
    greedy = SamplingParams(temperature=0.0, max_new_tokens=24)
    requests = [GenerationRequest(p, greedy, request_id=f"r{i}") for i, p in enumerate(prompts)]
    remote = client(server, teacher_dir)
    local = VLLMEngine(EngineConfig.of("vllm", model=str(teacher_dir), dtype="float32", context_tokens=CONTEXT,
                                    max_batch_size=8, kv_cache_mb=256, threads=1))
    try:
        # One request at a time on both sides: the same batch shapes, so the same kernels (across
        # batch compositions fp32 logprobs move by ~1e-5 within one engine too).
        served = [remote.generate([r])[0] for r in requests]
        here = [local.generate([r])[0] for r in requests]
        # OPD: the teacher scores a student's reply (here each greedy reply) after its prompt.
        pairs = [(p, r.token_ids) for p, r in zip(prompts, here)]
        # OPD scores a whole episode in one pass. vLLM scores a sequence as a prompt with one token
        # to generate: a server scores one token less than its max_model_len (a longer sequence is
        # refused, 400), the in-process engine keeps that token of room beyond its context.
        full = (prompts[1] * (CONTEXT // len(prompts[1]) + 1))[:CONTEXT]
        with pytest.raises(OpenAIServerError, match="400"):
            remote.score(full[:-100], full[-100:])
        assert len(local.score(full[:-100], full[-100:])) == 100
        with pytest.raises(ValueError, match=f"scores at most {CONTEXT}"):
            local.score(full, [5])
        # A request vLLM itself refuses fails its caller; the engine thread serves on (it used to
        # stop, leaving the caller waiting for ever).
        with pytest.raises(ValueError, match="vllm refused the request"):
            local.generate([GenerationRequest([10**6], greedy)])
        assert local.failure is None
        pairs.append((full[:-100], full[-100:-1]))
        served_scores = [remote.score(*pair) for pair in pairs]
        local_scores = [local.score(*pair) for pair in pairs]
    finally:
        local.close()
        remote.close()
    assert [r.token_ids for r in served] == [r.token_ids for r in here]
    assert len({tuple(r.token_ids) for r in here}) == len(prompts)  # the replies depend on the prompt
    logprob_gap = max(abs(a - b) for s, h in zip(served, here) for a, b in zip(s.logprobs, h.logprobs))
    assert [len(x) for x in served_scores] == [len(c) for _, c in pairs]
    score_gap = max(abs(a - b) for s, h in zip(served_scores, local_scores) for a, b in zip(s, h))
    sampled_vs_scored = max(abs(a - b) for r, s in zip(here, local_scores) for a, b in zip(r.logprobs, s))
    print(f"served vs in-process: greedy ids equal ({sum(len(r.token_ids) for r in here)} tokens), logprobs "
          f"within {logprob_gap:.2e}, OPD scores within {score_gap:.2e}; sampled vs scored {sampled_vs_scored:.2e}")
    assert logprob_gap <= 1e-5 and score_gap <= 1e-5


@pytest.mark.slow
def test_eval_with_the_served_teacher(server, teacher_dir, tiny_models, ray_cluster, tmp_path, capsys):
    out = tmp_path / "ev"
    args = ["eval", "--model", str(tiny_models["student"]), "--teacher", f"openai:{server.url}", "--handoff", "1",
            "--tokenizer", str(teacher_dir), "--served-model", NAME, "--n", "2", "--max-turns", "3",
            "--max-new-tokens", "16", "--concurrency", "2", "--out", str(out)]
    # The card's 16,384-token context does not fit a 2,048-token server: said before anything starts.
    assert main(args) == 2
    err = capsys.readouterr().err
    assert f"--context-tokens: 16384 tokens is more than the served model's context ({NAME!r}" in err
    assert f"max_model_len {CONTEXT}" in err and not out.parent.joinpath("ev.partial.jsonl").exists()
    wrong = [a if a != NAME else "Qwen/Qwen3-32B" for a in args]
    assert main([*wrong, "--context-tokens", str(CONTEXT)]) == 2
    assert f"--served-model: the server at {server.url} does not serve 'Qwen/Qwen3-32B'; it serves ['{NAME}']" \
        in capsys.readouterr().err

    assert main([*args, "--context-tokens", str(CONTEXT), "--backend", "vllm"]) == 0
    printed = capsys.readouterr().out
    assert f"eval: --model: {tiny_models['student']} on the vllm backend (vllm" in printed
    assert f"eval: --teacher: {NAME!r} served at {server.url} (max_model_len {CONTEXT}" in printed
    result = json.loads(out.with_suffix(".json").read_text())
    assert result["summary"]["overall"]["games"] == 2
    assert all(g["handoff_turn"] == 2 for g in result["games"] if g["turns"] >= 2)  # the teacher played on


@pytest.mark.slow
def test_a_short_opd_run_against_the_served_teacher(server, teacher_dir, tiny_models, ray_cluster, tmp_path, capsys):
    run_dir = tmp_path / "run"
    served = [f"tiny_dir={tiny_models['student'].parent}", f"run_dir={run_dir}", "algorithm=opd",
              "teacher_engine.backend=openai", f"teacher_engine.backend.base_url={server.url}",
              f"teacher_engine.tokenizer={teacher_dir}", f"teacher_engine.context_tokens={CONTEXT}"]
    short = ["steps=2", "rollout.batch_episodes=2", "rollout.max_turns=3", "env.games_per_worker=2",
             "rollout.student_sampling.max_new_tokens=16", "eval.before=false", "eval.after=false",
             "eval.teacher=false", "checkpoint_every=2", "student_engine.backend=hf"]
    # The warm-up trains a local teacher: with a served one it is refused, by key.
    assert main(["train", *served, f"teacher_engine.model={NAME}", *short]) == 2
    assert "teacher_warmup.enabled: the warm-up trains a local teacher folder" in capsys.readouterr().err
    short.append("teacher_warmup.enabled=false")
    assert main(["train", *served, "teacher_engine.model=tiny-student", *short]) == 2
    assert "teacher_engine.model: the server at" in capsys.readouterr().err and not run_dir.exists()
    # The tiny student's 2,048 tokens: a whole episode could not be scored by a 2,048-token server.
    assert main(["train", *served, f"teacher_engine.model={NAME}", *short]) == 2
    assert f"student_engine.context_tokens: the teacher scores episodes of up to {CONTEXT} tokens" in \
        capsys.readouterr().err and not run_dir.exists()
    short.append(f"student_engine.context_tokens={CONTEXT - 1}")

    t0 = time.monotonic()
    assert main(["train", *served, f"teacher_engine.model={NAME}", *short]) == 0
    print(f"2-step OPD against vLLM's server: {time.monotonic() - t0:.0f} s")
    printed = capsys.readouterr().out
    assert f"train: teacher engine: {NAME!r} served at {server.url} (max_model_len {CONTEXT}; logprobs and " \
           "scoring checked)" in printed
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["steps"] == 2 and summary["restarts"]["teacher engine"] == 0
    steps = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    opd = [s["learner/loss_opd"] for s in steps if "learner/loss_opd" in s]
    assert len(opd) == 2 and all(x != 0.0 for x in opd)  # every student token scored by the served teacher


@pytest.mark.slow
def test_a_server_stopped_gracefully_fails_its_requests_in_flight_fast(server, teacher_dir):
    """Last: stops the module's server. SIGTERM closes vLLM's listening socket and leaves the
    requests in flight unanswered (for as long as their clients wait); the client sees the
    server refuse connections, cuts its request off and, with the server gone, gives up after
    retry_s rather than waiting for an answer or a health watchdog."""
    engine = client(server, teacher_dir, retry_s=2.0)
    long = GenerationRequest([5, 6, 7, 8], SamplingParams(0.0, max_new_tokens=CONTEXT - 8))
    outcome: dict = {}

    def ask() -> None:
        t0 = time.monotonic()
        try:
            outcome["result"] = engine.generate([long] * 64)
        except Exception as e:  # noqa: BLE001 - what the test looks at
            outcome["error"] = e
        outcome["s"] = time.monotonic() - t0

    thread = threading.Thread(target=ask)
    thread.start()
    # The requests are being generated: 64 x 2,040 tokens, sent 8 at a time (the client's
    # max_batch_size), take the tiny teacher 8 rounds. On a quiet machine one request once took
    # ~1 s and 8 at once 0.51 s, finishing before a 0.5 s wait ended; 8 rounds take 4 s at that
    # speed. A request not yet sent when the server stops fails the same way (refused, then gone).
    time.sleep(0.25)
    assert "s" not in outcome, f"the request ended before the server was stopped: {outcome}"
    stopped_at = time.monotonic()
    server.proc.send_signal(signal.SIGTERM)
    thread.join(timeout=60)
    assert not thread.is_alive(), "the request still waits for the stopped server"
    waited = time.monotonic() - stopped_at
    print(f"a request in flight failed {waited:.1f} s after SIGTERM (cut off: {engine.stats()['cut_off']}): "
          f"{outcome.get('error')}")
    engine.close()
    # Cut off when vLLM leaves the request unanswered, or vLLM's own 500 when its API server
    # notices the engine core's end first (both happen): either way retried, and then gone.
    assert isinstance(outcome.get("error"), OpenAIServerGone), outcome
    message = str(outcome["error"])
    assert re.search(r"no answer after ([2-9]|\d\d+) attempts .*: cannot reach", message), message
    assert waited < 20, message
    # vLLM's shutdown then waits for the requests it left unanswered (the fixture's stop waited
    # its whole 60 s for them); what the test looks at is seen, so the server goes now.
    server.stop(signal.SIGKILL)
