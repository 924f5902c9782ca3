"""The knowledge report asked through Ray on real DiscoveryWorld games (marked `slow`); the evals
with a judge are tests/e2e/test_eval_with_a_judge.py, whose docstring says what both check."""

from __future__ import annotations

import asyncio

import pytest

from rose_ray.envs.discoveryworld.protocol import REPORT_QUESTION
from rose_ray.envs.worlds import get_world
from tests.e2e.test_eval_with_a_judge import ARCHAEOLOGY
from tests.unit.envs.test_knowledge import CHEMISTRY


# --------------------------------------------------------------------------- the report turn on real games
async def _episodes(tiny_models):
    from rose_ray.envs.config import EnvConfig
    from rose_ray.inference.engine import EngineConfig
    from rose_ray.rollout.actors import (
        close_pools,
        start_agents,
        start_env_pools,
        stop_agents,
    )
    from rose_ray.rollout.episode import EnvSlot, EpisodeConfig, run_episode
    from rose_ray.rollout.handoff import turn_policy
    from rose_ray.types import SamplingParams

    pools = start_env_pools(EnvConfig(world="discoveryworld", games_per_worker=2, cpus_per_worker=0.25), max_turns=2)
    student, teacher = start_agents(*(EngineConfig(model=str(tiny_models[o]), context_tokens=4096, dtype="float32")
                                      for o in ("student", "teacher")), student_cpus=0.25, teacher_cpus=0.25)
    sampling = SamplingParams(0.0, 1.0, 12)
    try:
        ask = EpisodeConfig(max_turns=2, student_sampling=sampling, teacher_sampling=sampling)
        train = EpisodeConfig(max_turns=2, student_sampling=sampling, teacher_sampling=sampling, report="train")
        return await asyncio.gather(
            run_episode(CHEMISTRY, EnvSlot(pools[0], 0), student, None, ask, turn_policy("none")),
            run_episode(ARCHAEOLOGY, EnvSlot(pools[0], 1), student, teacher, train, turn_policy("fixed", k=1)),
        )
    finally:
        close_pools(pools)
        stop_agents(student, teacher)


@pytest.mark.slow
def test_the_report_is_asked_after_the_last_observation_and_recorded(tiny_models, ray_cluster):
    from rose_ray.tokens import TokenWeights, loss_turns, render

    solo, stitched = asyncio.run(_episodes(tiny_models))
    # Asked: the last observation with the question after it; the student answers; no step taken.
    assert solo.rounds == 2 and solo.end_reason == "turn_limit" and solo.report is not None
    question, reply = solo.report_turns
    assert question.text == solo.turns[-1].text.rstrip() + "\n\n" + REPORT_QUESTION
    assert question.role == "user" and question.token_ids and reply.owner == "student" and reply.token_ids
    assert solo.report == reply.text.strip()
    assert all(REPORT_QUESTION not in t.text for t in solo.turns)  # not in the turns the learner sees
    assert solo.scoring["critical_questions"] and "process" in solo.scoring
    assert solo.to_record()["report"] == solo.report
    # "train": the exchange replaces the last observation, so the learner sees it; the teacher
    # acted last (handoff after turn 1), so the teacher answers and its report carries loss.
    assert stitched.rounds == 2 and stitched.handoff_turn == 2
    assert stitched.turns[-2].text.endswith(REPORT_QUESTION) and stitched.turns[-1].owner == "teacher"
    assert stitched.turns[-2:] == stitched.report_turns
    seq = render(stitched)
    assert loss_turns(seq, len(stitched.turns), TokenWeights(ce={"teacher": 1.0}))[-1]
    # ScienceWorld asks nothing: its protocol has no report question.
    assert get_world("sciworld").protocol.report_question is None
