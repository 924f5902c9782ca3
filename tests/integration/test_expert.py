"""The half of tests/unit/envs/test_expert.py whose tests start processes
(Ray, JVMs, servers or commands); that file's docstring says what both halves check."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from rose_ray.config import load_config
from rose_ray.envs.pool import EnvPool
from rose_ray.envs.protocol import parse_action
from rose_ray.envs.sciworld.catalogue import SciWorldCatalogue
from rose_ray.envs.sciworld.protocol import location_of
from rose_ray.types import OWNERS
from tests.unit.envs.test_expert import play_expert
from tests.unit.provision.test_small_tier import SMALL


def test_the_expert_says_when_it_has_no_plan_and_plans_again_when_the_game_goes_another_way():
    cfg = load_config(SMALL)
    catalogue = SciWorldCatalogue(cfg.env.mapping)
    lifespan = catalogue.sample("train", 1, 0, tasks=["lifespan-longest-lived"])[0]
    pool = EnvPool(num_games=1, world="sciworld")
    try:
        # A plan, then another move than the plan's: the next reply comes from a new plan, which wins.
        pool.reset(0, lifespan)
        first = pool.expert_reply(0)
        assert first.planned and first.verified and first.replans == 0 and first.status == "verified"
        pool.step(0, "look around")  # not what the plan said
        again = pool.expert_reply(0)
        assert again.replans == 1 and again.planned
        replies, result = play_expert(pool)
        assert result.success and all(r.replans == 1 for r in replies)
        # A lost game (a wrong focus: -100) leaves nothing to plan for: it says so (an episode
        # never hands a finished game over; asked anyway, it answers at once).
        pool.reset(0, lifespan)
        lost = pool.step(0, "focus on agent")
        assert lost.raw_score == -100 and lost.done
        reply = pool.expert_reply(0)
        assert reply.text is None and not reply.planned and reply.status == "unwinnable"
    finally:
        pool.close()


def test_the_state_fingerprint_follows_room_inventory_and_focus():
    cfg = load_config(SMALL)
    game = SciWorldCatalogue(cfg.env.mapping).sample("train", 1, 0, tasks=["find-non-living-thing"])[0]
    pool = EnvPool(num_games=1, world="sciworld")
    try:
        first = pool.reset(0, game)
        state = pool.state(0)
        assert state["now"] == state["initial"] and state["initial"]["room"] == location_of(first.observation)
        assert state["initial"]["focus"] == [] and "inventory" in state["initial"]["inventory"]
        replies, result = play_expert(pool)
        assert result.success
        now = pool.state(0)["now"]
        moved = any(parse_action(r.text).action.startswith("go to") for r in replies)
        assert (now["room"] != state["initial"]["room"]) == moved and len(now["focus"]) == 1
    finally:
        pool.close()


class LocalSlot:
    """An EnvPool slot called in this process (no Ray), as an episode awaits it."""

    def __init__(self, pool: EnvPool) -> None:
        self.pool = pool

    async def call(self, method: str, *args):  # as EnvSlot.call
        return await getattr(self, method)(*args)

    async def reset(self, game):
        return self.pool.reset(0, game)

    async def step(self, action):
        return self.pool.step(0, action)

    async def expert_reply(self):
        return self.pool.expert_reply(0)

    async def state(self):
        return self.pool.state(0)


def test_the_experts_turns_render_and_train_as_a_model_teachers(tiny_models):
    """An episode on a real game: the student (a scripted engine: the engine is not under test)
    plays 2 turns, the expert the rest. Played again with a model teacher that writes the very
    same texts, the learner's rows and every loss weight are the same: the expert's turns are the
    teacher's, in the student's ids, with no logprobs; the student's own turns train nothing."""
    from rose_ray.chat import ChatFormat
    from rose_ray.models import load_tokenizer
    from rose_ray.recipes.rose import Rose
    from rose_ray.rollout.agent import Agent, EpisodeConfig, expert_agent
    from rose_ray.rollout.episode import run_episode
    from rose_ray.rollout.handoff import turn_policy
    from rose_ray.tokens import make_batch, render
    from rose_ray.types import SamplingParams
    from tests.unit.rollout.test_episode import ScriptedEngine

    chat = ChatFormat(load_tokenizer(tiny_models["student"]))
    game = SciWorldCatalogue().sample("train", 1, 1, tasks=["lifespan-shortest-lived"])[0]
    config = EpisodeConfig(max_turns=14, student_sampling=SamplingParams(1.0, 1.0, 32),
                           teacher_sampling=SamplingParams(0.0, 1.0, 32), report="off")
    opening = ["look around", "open door to nowhere"]
    pool = EnvPool(num_games=1, world="sciworld")
    try:
        student = Agent(ScriptedEngine(chat, opening), chat, "student")
        by_expert = asyncio.run(run_episode(game, LocalSlot(pool), student, expert_agent(student), config,
                                            turn_policy("fixed", k=2)))
        texts = [t.text for t in by_expert.turns if t.owner == "teacher"]
        model = Agent(TextEngine(chat, texts), chat, "teacher")
        student = Agent(ScriptedEngine(chat, opening), chat, "student")
        by_model = asyncio.run(run_episode(game, LocalSlot(pool), student, model, config, turn_policy("fixed", k=2)))
    finally:
        pool.close()
    assert by_expert.success and by_expert.handoff_turn == 3 and by_expert.end_reason == "success"
    assert by_expert.expert["planned"] and by_expert.expert["verified"] and by_model.expert is None
    assert by_expert.handoff_state == by_model.handoff_state == {"room": False, "inventory": False, "focus": False,
                                                                "changed": False}
    assert [t.text for t in by_model.turns] == [t.text for t in by_expert.turns]
    teacher = [t for t in by_expert.turns if t.owner == "teacher"]
    assert teacher and all(t.logprobs is None and t.policy_version is None and t.token_ids[-1] == chat.eos_id
                           for t in teacher)
    weights = Rose().token_weights()
    rows = [render(t) for t in (by_expert, by_model)]
    assert rows[0].input_ids == rows[1].input_ids and rows[0].owners == rows[1].owners
    batches = [make_batch([r], weights, 4096) for r in rows]
    assert np.array_equal(batches[0].weights["ce"], batches[1].weights["ce"])
    trained = batches[0].weights["ce"][0][: len(rows[0])] > 0
    assert trained.sum() > 0 and set(np.array(rows[0].owners)[trained]) == {OWNERS.index("teacher")}


class TextEngine:
    """A model teacher's engine handle that writes the given texts in turn, its ids its
    tokenizer's (as a model that sampled exactly those tokens and stopped)."""

    def __init__(self, chat, texts: list[str]) -> None:
        from tests.unit.rollout.test_episode import Remote

        self.chat, self.texts = chat, list(texts)
        self.generate = Remote(self._generate)

    def _generate(self, request):
        from rose_ray.inference.engine import GenerationResult

        text = self.texts.pop(0)
        ids = self.chat.encode(text) + [self.chat.eos_id]
        return GenerationResult(text, ids, [-0.5] * len(ids), "stop", len(request.prompt_ids), 0)


def test_warm_up_demonstrations_continue_with_the_expert_after_the_students_opening():
    """teacher_warmup.continuation=expert: after the base student's real turns (here: replies
    that move, and junk), the expert plays from the state they left, and wins; the opening's
    replies stay the student's (context), the expert's are the teacher's, as its replies read."""
    from rose_ray.provision.gold import gold_rows

    cfg = load_config(SMALL)
    games = SciWorldCatalogue(cfg.env.mapping).sample("train", 4, 0, tasks=cfg.tasks)
    openings = {games[0].item_id: ["Thought: go.\nAction: open door to hallway", "Thought: go.\nAction: go to hallway"],
                games[1].item_id: ["Thought: I am in the"]}
    rows, problems = gold_rows(games, workers=2, progress=False, openings=openings, continuation="expert")
    assert len(rows) == 4 and all(r["success"] for r in rows), problems
    for game, row in zip(games, rows):
        replies = row["conversations"][3::2]
        n = len(openings.get(game.item_id, []))
        assert [m["owner"] for m in replies[:n]] == ["student"] * n and all(m["owner"] == "teacher" for m in replies[n:])
        assert all(m["content"].startswith("Thought: I am in the ") for m in replies[n:])
    with pytest.raises(Exception, match="continuation"):
        gold_rows(games[:1], progress=False, continuation="oracle")
