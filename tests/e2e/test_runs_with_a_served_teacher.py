"""The slow half of tests/unit/inference/test_served_teacher.py (marked `slow`: whole runs, servers, jobs); that
file's docstring says what both halves check."""

from __future__ import annotations

import json
import os
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from rose_ray.cli import main
from rose_ray.envs.worlds import get_world
from rose_ray.inference.engine import EngineConfig, GenerationRequest
from rose_ray.inference.openai import OpenAIEngine, OpenAIRequestFailed
from rose_ray.types import SamplingParams
from tests.served import Served, free_port, start_server

NAME = "mismatched-teacher"


CATALOGUE = get_world("sciworld").catalogue(None)


WORD = "animal"  # in find-animal task descriptions, not in find-plant ones


@pytest.fixture(scope="module")
def mismatched(tiny_models, tmp_path_factory) -> Path:
    """The tiny teacher with a tokenizer one token longer than its embeddings."""
    import shutil

    from rose_ray.models import load_tokenizer

    out = tmp_path_factory.mktemp("mismatched") / "teacher"
    shutil.copytree(tiny_models["teacher"], out)
    tok = load_tokenizer(out)
    assert tok.add_tokens([WORD]) == 1
    tok.save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def server(mismatched, tmp_path_factory) -> Served:
    port = free_port()
    cmd = [sys.executable, "-m", "rose_ray.cli", "serve", str(mismatched), "--backend", "hf", "--port", str(port),
           "--served-model-name", NAME, "--dtype", "float32", "--threads", "1", "--context-tokens", "2048"]
    srv = start_server(cmd, tmp_path_factory.mktemp("serve") / "server.log", dict(os.environ), port)
    yield srv
    srv.stop()


def client(server: Served, mismatched: Path, **overrides) -> OpenAIEngine:
    return OpenAIEngine(EngineConfig.of("openai", base_url=server.url, model=NAME, tokenizer=str(mismatched),
                                     context_tokens=2048, max_batch_size=4, **overrides))


TINY = str(Path(__file__).resolve().parents[2] / "configs" / "tiny.yaml")


def served_teacher(server: Served, mismatched: Path, tiny_models) -> list[str]:
    return [f"tiny_dir={tiny_models['student'].parent}", "teacher_engine.backend=openai",
            f"teacher_engine.backend.base_url={server.url}", f"teacher_engine.model={NAME}",
            f"teacher_engine.tokenizer={mismatched}", "teacher_warmup.enabled=false"]


@pytest.mark.slow
@pytest.mark.parametrize("extra, message", [
    ([], None),
    (["teacher_engine.model=Qwen/Qwen3-32B"],
     f"teacher_engine.model: the server at {{url}} does not serve 'Qwen/Qwen3-32B'; it serves ['{NAME}']"),
    (["teacher_engine.context_tokens=4096", "learner.max_tokens=4096"],
     f"teacher_engine.context_tokens: 4096 tokens is more than the served model's context ('{NAME}' at {{url}}: "
     "max_model_len 2048)"),
    (["teacher_engine.backend.base_url=http://127.0.0.1:9/v1"],
     "teacher_engine.backend.base_url: http://127.0.0.1:9/v1: no answer after 1 attempts"),
    (["teacher_engine.tokenizer=/nonexistent"], "teacher_engine.tokenizer: an openai engine needs the served "
                                                "model's tokenizer on this machine"),
    (["teacher_warmup.enabled=true"], "teacher_warmup.enabled: the warm-up trains a local teacher folder"),
])
def test_check_asks_the_served_teacher(server, mismatched, tiny_models, extra, message, capsys):
    code = main(["check", TINY, *served_teacher(server, mismatched, tiny_models), *extra, "--node", "CPU=4"])
    out, err = capsys.readouterr()
    if message is None:
        assert code == 0, err
        assert f"teacher engine: '{NAME}' served at {server.url} (max_model_len 2048; logprobs checked)" in out
    else:
        assert code == 2 and message.format(url=server.url) in err, err


@pytest.mark.slow
def test_commands_take_served_models(server, mismatched, tiny_models, ray_cluster, tmp_path, capsys):
    """collect with a served student, continue and eval with a served teacher: each names the
    served model it checked; a served model without --tokenizer is refused by flag before anything
    starts."""
    prefixes, stitched = tmp_path / "prefixes.jsonl", tmp_path / "stitched.jsonl"
    served = [f"openai:{server.url}", "--tokenizer", str(mismatched), "--served-model", NAME]
    common = ["--max-new-tokens", "8", "--context-tokens", "2048", "--concurrency", "1"]
    assert main(["collect", "--model", f"openai:{server.url}", "--turns", "1", "--n", "1", "--out", str(prefixes),
                 *common]) == 2
    assert f"--model openai:{server.url}: a served model needs --tokenizer" in capsys.readouterr().err
    assert main(["collect", "--model", *served, "--turns", "1", "--n", "1", "--seed", "3", "--out", str(prefixes),
                 *common]) == 0
    assert f"collect: --model: '{NAME}' served at {server.url}" in capsys.readouterr().out
    assert main(["continue", "--teacher", *served, "--in", str(prefixes), "--max-turns", "2", "--out", str(stitched),
                 *common]) == 0
    out, err = capsys.readouterr()
    assert f"continue: --teacher: '{NAME}' served at {server.url}" in out
    rows = [json.loads(line) for line in stitched.read_text().splitlines()]
    assert len(rows) == 1, err
    assert [m["owner"] for m in rows[0]["conversations"] if m["role"] == "assistant"][1:] == ["student", "teacher"]
    # eval hands over to the served teacher (its --tokenizer is the teacher's too); on a game whose
    # task names the word the server fails the teacher's request: said plainly, exit 1.
    assert main(["eval", "--model", str(tiny_models["student"]), "--teacher", *served, "--handoff", "1",
                 "--tasks", "find-animal", "--n", "1", "--max-turns", "2", "--backend", "hf",
                 "--out", str(tmp_path / "ev"), *common]) == 1
    assert "rose-ray eval: error: a served model failed: OpenAIRequestFailed: 500: internal server error: " \
           "IndexError" in capsys.readouterr().err


@pytest.mark.slow
def test_a_request_the_server_always_fails_is_its_own_failure(server, mismatched):
    from rose_ray.models import load_tokenizer

    tok = load_tokenizer(mismatched)
    bad = tok(f"Your task is to find a(n) {WORD}.", add_special_tokens=False)["input_ids"]
    good = tok("Your task is to find a(n) plant.", add_special_tokens=False)["input_ids"]
    assert len(tok) - 1 in bad and len(tok) - 1 not in good
    engine = client(server, mismatched, retry_s=120.0)  # a dead server would get two minutes
    greedy = SamplingParams(0.0, max_new_tokens=4)
    try:
        t0 = time.monotonic()
        with pytest.raises(OpenAIRequestFailed) as failed:
            engine.generate([GenerationRequest(bad, greedy)])
        took = time.monotonic() - t0
        assert engine.generate([GenerationRequest(good, greedy)])[0].token_ids  # the server is fine
    finally:
        engine.close()
    message = str(failed.value)
    assert message.startswith("500: internal server error: IndexError") and "answered others" in message
    assert took < 30, took  # two tries and a probe, not retry_s


def first_draws(tasks: list[str], seed: int, n: int) -> list[str]:
    """The tasks of a run's first `n` games (its GameSampler over the train split)."""
    from rose_ray.rollout.ledger import GameSampler

    sampler = GameSampler(CATALOGUE.sample("train", None, seed, tasks=tasks), seed=seed)
    return [sampler.next().task for _ in range(n)]


@pytest.mark.slow
def test_a_run_fails_only_the_episodes_the_server_rejects(server, mismatched, tiny_models, ray_cluster, tmp_path):
    run_dir = tmp_path / "run"
    tasks = ["find-animal", "find-plant"]
    # A seed whose first two games (played at once) are one of each: one fails at once, one trains.
    seed = next(s for s in range(100) if sorted(first_draws(tasks, s, 2)) == tasks)
    assert main(["train", f"tiny_dir={tiny_models['student'].parent}", f"run_dir={run_dir}", "steps=2",
                 f"seed={seed}", "tasks=[find-animal,find-plant]", "teacher_warmup.enabled=false", "rollout.batch_episodes=2",
                 "rollout.max_turns=3", "algorithm.handoff.k=1", "rollout.student_sampling.max_new_tokens=12",
                 "rollout.student_sampling.temperature=0.0",  # a sampled reply could hold the word in a find-plant game
                 "rollout.teacher_sampling.max_new_tokens=12", "env.games_per_worker=2", "eval.before=false",
                 "eval.after=false", "eval.teacher=false", "checkpoint_every=2",
                 "teacher_engine.backend=openai", f"teacher_engine.backend.base_url={server.url}",
                 f"teacher_engine.model={NAME}", f"teacher_engine.tokenizer={mismatched}",
                 "teacher_engine.backend.retry_s=20", "reliability.max_restarts=1"]) == 0
    records = [json.loads(line) for line in (run_dir / "episodes.jsonl").read_text().splitlines()]
    outcomes = Counter(r["outcome"] for r in records)
    failed = [r for r in records if r["outcome"] == "failed"]
    assert outcomes["trained"] == 4 and failed, outcomes
    tasks = {r["item_id"]: CATALOGUE.game(r["item_id"]).task for r in records}
    for r in failed:  # a game whose task names the word; whose request it was, and what the server said
        assert tasks[r["item_id"]] == "find-animal", r
        assert r["error"].startswith("teacher engine: OpenAIRequestFailed: 500: internal server error: IndexError"), r
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["restarts"]["teacher engine"] == 0 and summary["steps"] == 2


@pytest.mark.slow
def test_a_run_whose_every_episode_fails_stops_naming_why(server, mismatched, tiny_models, ray_cluster, tmp_path,
                                                         capsys):
    """Every game's teacher request is refused (each names the word): the run stops after
    reliability.max_failed_in_a_row failures, exit 1 with the last error, not at the watchdog."""
    run_dir = tmp_path / "run"
    t0 = time.monotonic()
    assert main(["train", *served_teacher(server, mismatched, tiny_models), f"run_dir={run_dir}", "steps=2",
                 "tasks=[find-animal]", "rollout.batch_episodes=2", "rollout.max_turns=2", "algorithm.handoff.k=1",
                 "rollout.student_sampling.max_new_tokens=8", "env.games_per_worker=2", "eval.before=false",
                 "eval.after=false", "eval.teacher=false", "reliability.max_failed_in_a_row=3",
                 "teacher_engine.backend.retry_s=20"]) == 1
    err = capsys.readouterr().err
    assert "rose-ray train: error: 3 episodes in a row failed, none finishing between them " \
           "(reliability.max_failed_in_a_row=3); the last: teacher engine: OpenAIRequestFailed: 500" in err, err
    outcomes = Counter(json.loads(line)["outcome"] for line in (run_dir / "episodes.jsonl").read_text().splitlines())
    assert outcomes["failed"] >= 3 and outcomes["trained"] == 0, outcomes
    assert time.monotonic() - t0 < 300
