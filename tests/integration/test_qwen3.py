"""The half of tests/unit/test_qwen3.py whose tests start processes
(Ray, JVMs, servers or commands); that file's docstring says what both halves check."""

from __future__ import annotations

import asyncio
import math

from rose_ray.chat import ChatFormat
from rose_ray.envs.sciworld.protocol import PROTOCOL
from rose_ray.models import load_tokenizer
from tests.unit.test_qwen3 import _sampled_prompt


class _Recorded:
    """A real engine actor whose every generation request's prompt ids are kept on their way
    to the actor; the actor answers it."""

    def __init__(self, actor, log: list) -> None:
        outer = self

        class _Generate:
            def remote(self, request):
                log.append(list(request.prompt_ids))
                return outer.actor.generate.remote(request)

        self.actor, self.generate = actor, _Generate()


async def _one_episode(tiny_qwen3, student_tokens: int, history: str = "sampled", log: list | None = None):
    from rose_ray.envs.config import EnvConfig
    from rose_ray.envs.sciworld.catalogue import SciWorldCatalogue
    from rose_ray.rollout.actors import (
        close_pools,
        start_agents,
        start_env_pools,
        stop_agents,
    )
    from rose_ray.rollout.episode import EnvSlot, EpisodeConfig, run_episode
    from rose_ray.rollout.handoff import turn_policy
    from rose_ray.types import SamplingParams

    pools = start_env_pools(EnvConfig(games_per_worker=1, cpus_per_worker=0.25), max_turns=4)
    student, teacher = start_agents(*(engine_config(tiny_qwen3[o]) for o in ("student", "teacher")),
                                    student_cpus=0.25, teacher_cpus=0.25, history=history)
    actors = (student, teacher)
    if log is not None:
        from dataclasses import replace

        student, teacher = (replace(a, engine=_Recorded(a.engine, log)) for a in actors)
    try:
        config = EpisodeConfig(max_turns=4, student_sampling=SamplingParams(1.0, 1.0, student_tokens, seed=3),
                               teacher_sampling=SamplingParams(0.0, 1.0, 24))
        return await run_episode(SciWorldCatalogue().find("find-plant", 100), EnvSlot(pools[0], 0), student, teacher,
                                 config, turn_policy("fixed", k=2), protocol=PROTOCOL)
    finally:
        close_pools(pools)
        stop_agents(*actors)


def engine_config(path):
    from rose_ray.inference.engine import EngineConfig

    return EngineConfig(model=str(path), context_tokens=4096, dtype="float32")


def test_the_learner_trains_on_the_ids_the_engines_sampled(tiny_qwen3, ray_cluster):
    """A real episode on the Qwen3-like models: the student's replies are cut at 6 tokens.
    Every reply's ids are what its engine produced for exactly the prompt the rollout built;
    the learner's trained positions are the teacher's ids, and no appended end-of-turn id."""
    from rose_ray.inference.engine import GenerationRequest
    from rose_ray.inference.hf import HFEngine
    from rose_ray.tokens import TokenWeights, make_batch
    from rose_ray.tokens import render as render_seq
    from rose_ray.types import SamplingParams

    traj = asyncio.run(_one_episode(tiny_qwen3, student_tokens=6))
    replies = [t for t in traj.turns if t.role == "assistant" and t.owner != "prompt"]
    assert [t.owner for t in replies] == ["student", "student", "teacher", "teacher"][: len(replies)]
    assert len(replies) >= 3
    student_replies = [t for t in replies if t.owner == "student"]
    assert all(t.truncated and len(t.token_ids) == 7 for t in student_replies)  # 6 sampled + end of turn
    assert traj.truncated_turns >= 2 and traj.cut_before_action >= 2

    engines = {o: HFEngine(engine_config(tiny_qwen3[o])) for o in ("student", "teacher")}
    eos = engines["student"].chat.eos_id
    for n, turn in enumerate(traj.turns):
        if turn not in replies:
            continue
        prompt = [i for t in traj.turns[:n] for i in t.token_ids]
        sampled = turn.token_ids[:-1] if turn.truncated else turn.token_ids
        if turn.owner == "teacher":  # greedy: the same prompt gives the same ids
            again = engines["teacher"].generate([GenerationRequest(prompt, SamplingParams(0.0, 1.0, 24))])[0]
            assert again.token_ids == sampled
        else:  # sampled: the recorded logprobs are the model's for these ids after this prompt
            scored = engines["student"].score(prompt, sampled)
            assert all(math.isclose(a, b, abs_tol=1e-3) for a, b in zip(scored, turn.logprobs))
            assert len(turn.logprobs) == len(sampled) and turn.token_ids[-1] == eos

    seq = render_seq(traj)
    assert seq.input_ids == [i for t in traj.turns for i in t.token_ids]
    batch = make_batch([seq], TokenWeights(ce={"teacher": 1.0, "student": 1.0}), max_tokens=len(seq))
    trained = [int(i) for i, w in zip(batch.input_ids[0], batch.weights["ce"][0]) if w > 0]
    expected = [i for t in replies for i in (t.token_ids[:-1] if t.truncated else t.token_ids)]
    assert trained == expected


def test_a_template_history_episode_prompts_as_a_chat_api_would(tiny_qwen3, ray_cluster):
    """A real episode with chat.history=template: each prompt the student's and the teacher's
    engines got is the template's rendering of the conversation at that turn, and the trajectory
    the learner trains on is its rendering of the whole conversation."""
    from rose_ray.tokens import TokenWeights, make_batch
    from rose_ray.tokens import render as render_seq

    log: list = []
    traj = asyncio.run(_one_episode(tiny_qwen3, student_tokens=6, history="template", log=log))
    chat = ChatFormat(load_tokenizer(tiny_qwen3["student"]), history="template")
    assert len(log) == traj.rounds >= 3
    conv = [{"role": t.role, "content": t.text} for t in traj.turns]
    replies = [n for n, t in enumerate(traj.turns) if t.role == "assistant" and t.owner != "prompt"]
    assert log == [chat.render_ids(conv[:n], True) for n in replies]  # the conversation before each reply
    # Sampled history would have kept the empty think block before each earlier reply.
    assert len(_sampled_prompt(ChatFormat(chat.tokenizer), conv[: replies[-1]])) > len(log[-1])
    seq = render_seq(traj)
    assert seq.input_ids == chat.render_ids(conv, False)
    batch = make_batch([seq], TokenWeights(ce={"teacher": 1.0}), max_tokens=len(seq))
    trained = [int(i) for i, w in zip(batch.input_ids[0], batch.weights["ce"][0]) if w > 0]
    teacher = [t for t in traj.turns if t.owner == "teacher"]
    assert teacher and trained == [i for t in teacher for i in (t.token_ids[t.frame:-1] if t.truncated
                                                                 else t.token_ids[t.frame:])]
    assert all(t.logprobs is None for t in traj.turns if t.role == "assistant")
