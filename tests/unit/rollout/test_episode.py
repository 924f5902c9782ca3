"""`run_episode` alone, with a scripted game slot and scripted engines (no Ray, no JVM, no
model): who acts at each turn under on_failure and decay, the different-tokenizer path, and
the context cut, decided once by the conversation: the engine's prompt and the learner's row. The tokenizers and chat templates are the
real tiny ones; the engines are scripted because what is under test is the episode's logic."""

from __future__ import annotations

import asyncio

import pytest

from rose_ray.chat import ChatFormat
from rose_ray.envs.base import StepResult
from rose_ray.inference.engine import GenerationResult
from rose_ray.models import load_tokenizer
from rose_ray.rollout.context import ContextSettings
from rose_ray.rollout.episode import (
    Agent,
    EpisodeConfig,
    ReplayMismatch,
    run_episode,
)
from rose_ray.rollout.handoff import decay_takes_over, turn_policy
from rose_ray.tokens import render
from rose_ray.types import GameId, SamplingParams, Turn

GAME = GameId("find-plant", 0, "sciworld_7")


INVALID = "No known action matches that input."


class ScriptedGame:
    """An EnvSlot: answers each action with a canned observation (`bad` actions are invalid); its
    state is the room, which `go to X` changes."""

    def __init__(self, bad: tuple[str, ...] = ()) -> None:
        self.bad, self.actions, self.room = bad, [], "kitchen"

    async def call(self, method: str, *args):  # as EnvSlot.call
        return await getattr(self, method)(*args)

    async def reset(self, game: GameId) -> StepResult:
        self.room = "kitchen"
        return StepResult("You are in the kitchen.", game=game)

    async def step(self, action: str) -> StepResult:
        self.actions.append(action)
        if action.startswith("go to ") and action not in self.bad:
            self.room = action[len("go to "):]
        return StepResult(INVALID if action in self.bad else f"You did {action}.", turn=len(self.actions))

    async def state(self) -> dict:
        return {"initial": {"room": "kitchen"}, "now": {"room": self.room}}


class Remote:
    """`obj.method.remote(...)` as an awaitable, the way a Ray actor handle is called."""

    def __init__(self, fn) -> None:
        self.fn = fn

    def remote(self, *args):
        async def call():
            return self.fn(*args)
        return call()


class ScriptedEngine:
    """Replies `Action: <actions[i]>` in turn, as ids of its own tokenizer; records requests."""

    def __init__(self, chat: ChatFormat, actions: list[str], version: int = 7,
                 version_end: int | None = None) -> None:
        self.chat, self.actions, self.version = chat, list(actions), version
        self.version_end = version_end  # a weight update landed under each reply (publish.in_flight keep)
        self.requests, self.scored = [], []
        self.generate = Remote(self._generate)
        self.score = Remote(self._score)

    def _score(self, prompt: list[int], ids: list[int]) -> list[float]:
        self.scored.append((list(prompt), list(ids)))
        return [-0.25] * len(ids)

    def _generate(self, request) -> GenerationResult:
        self.requests.append(request)
        text = f"Thought: go on.\nAction: {self.actions.pop(0)}"
        ids = self.chat.encode(text) + [self.chat.eos_id]
        return GenerationResult(text, ids, [-0.5] * len(ids), "stop", len(request.prompt_ids),
                                self.version, version_end=self.version_end,
                                tokens_on_version=None if self.version_end is None else 1)


@pytest.fixture(scope="module")
def chats(tiny_models, tiny_qwen3):
    plain = ChatFormat(load_tokenizer(tiny_models["student"]))
    return {"student": plain, "qwen3": ChatFormat(load_tokenizer(tiny_qwen3["teacher"]))}


def play(student, teacher, handoff, game=None, max_turns=4, scored=False, seed=None):
    config = EpisodeConfig(max_turns=max_turns, score_student_with_teacher=scored,
                           student_sampling=SamplingParams(1.0, 1.0, 32), teacher_sampling=SamplingParams(0.0, 1.0, 32))
    return asyncio.run(run_episode(GAME, game or ScriptedGame(), student, teacher, config, handoff,
                                   handoff_seed=seed))


def owners(t) -> list[str]:
    return [x.owner for x in t.turns if x.role == "assistant" and x.owner != "prompt"]


def test_on_failure_hands_over_after_the_students_first_invalid_action(chats):
    chat = chats["student"]
    student = Agent(ScriptedEngine(chat, ["look around", "eat rock", "x", "y"]), chat, "student")
    teacher = Agent(ScriptedEngine(chat, ["open door", "go to hallway"]), chat, "teacher")
    game = ScriptedGame(bad=("eat rock",))
    t = play(student, teacher, turn_policy("on_failure"), game=game)
    assert owners(t) == ["student", "student", "teacher", "teacher"]
    assert t.handoff_turn == 3 and t.invalid_actions == 1
    assert game.actions == ["look around", "eat rock", "open door", "go to hallway"]
    # The student's turns carry their sampled ids, logprobs and policy version; the teacher's do not.
    first = next(x for x in t.turns if x.owner == "student")
    assert first.policy_version == 7 and first.logprobs == [-0.5] * len(first.token_ids)
    assert all(x.policy_version is None for x in t.turns if x.owner == "teacher")


def test_on_failure_hands_over_after_the_students_first_repeated_action(chats):
    """A valid action sent again is the other failure on_failure looks for: the teacher plays
    from the turn after the repeat, never later; the handoff records the room the student left."""
    chat = chats["student"]
    student = Agent(ScriptedEngine(chat, ["go to hallway", "go to hallway", "x", "y"]), chat, "student")
    teacher = Agent(ScriptedEngine(chat, ["look around", "wait"]), chat, "teacher")
    t = play(student, teacher, turn_policy("on_failure"))
    assert owners(t) == ["student", "student", "teacher", "teacher"] and t.handoff_turn == 3
    assert t.invalid_actions == 0 and t.repeated_turns == [5]  # the second reply (turn 5 of the list)
    assert t.handoff_state == {"room": True, "changed": True}
    # Whoever fails first, the first failure hands over: an invalid first action at turn 2.
    student = Agent(ScriptedEngine(chat, ["eat rock", "eat rock"]), chat, "student")
    teacher = Agent(ScriptedEngine(chat, ["look around", "wait", "wait"]), chat, "teacher")
    t = play(student, teacher, turn_policy("on_failure"), game=ScriptedGame(bad=("eat rock",)))
    assert owners(t) == ["student", "teacher", "teacher", "teacher"] and t.handoff_state == {"room": False,
                                                                                          "changed": False}


class ExpertSlot(ScriptedGame):
    """A scripted game slot whose expert has a plan for `planned` replies, then none."""

    def __init__(self, planned: int) -> None:
        super().__init__()
        self.planned = planned

    async def expert_reply(self):
        from rose_ray.envs.base import ExpertReply

        if self.planned <= 0:
            return ExpertReply(None, status="no_plan")
        self.planned -= 1
        return ExpertReply("Thought: I am in the kitchen. To make progress on the task, I will wait next.\nAction: wait",
                           "wait", planned=True, verified=True, status="verified", plan_s=0.5)


def test_an_expert_without_a_plan_ends_the_episode_there(chats):
    """The expert's replies come from the slot (no engine is asked); where it has no plan the
    episode ends (`no_plan`), and the trajectory keeps what the expert had at the handoff."""
    from rose_ray.rollout.agent import expert_agent

    chat = chats["student"]
    student = Agent(ScriptedEngine(chat, ["look around", "go to hallway"]), chat, "student")
    t = play(student, expert_agent(student), turn_policy("fixed", k=2), game=ExpertSlot(planned=1), max_turns=6)
    assert owners(t) == ["student", "student", "teacher"] and t.end_reason == "no_plan" and t.rounds == 3
    assert t.expert == {"planned": True, "verified": True, "plan_s": 0.5, "status": "no_plan", "replans": 0}
    reply = [x for x in t.turns if x.owner == "teacher"][0]
    assert reply.token_ids == chat.assistant_ids(reply.text) and reply.logprobs is None
    assert t.handoff_turn == 3 and t.handoff_state == {"room": True, "changed": True}
    # No plan at the handoff itself: the teacher never acted, so there was no handoff.
    student = Agent(ScriptedEngine(chat, ["look around", "wait"]), chat, "student")
    t = play(student, expert_agent(student), turn_policy("fixed", k=2), game=ExpertSlot(planned=0), max_turns=6)
    assert owners(t) == ["student", "student"] and t.handoff_turn is None and t.handoff_state is None
    assert t.expert["planned"] is False and t.end_reason == "no_plan"


def test_a_reply_that_spanned_a_weight_update_keeps_its_starting_version(chats):
    """publish.in_flight keep: a student reply sampled across an update counts as the version
    it started on (the trajectory's staleness, each token's version) and records the later one;
    a teacher's reply records neither."""
    from rose_ray.tokens import render

    chat = chats["student"]
    student = Agent(ScriptedEngine(chat, ["look around", "eat rock", "x", "y"], version_end=8), chat, "student")
    teacher = Agent(ScriptedEngine(chat, ["open door", "go to hallway"], version_end=8), chat, "teacher")
    t = play(student, teacher, turn_policy("on_failure"), game=ScriptedGame(bad=("eat rock",)))
    replies = [x for x in t.turns if x.owner == "student"]
    assert replies and all(x.policy_version == 7 and x.policy_version_end == 8 for x in replies)
    assert all(x.policy_version_end is None for x in t.turns if x.owner == "teacher")
    assert t.student_version == 7
    assert set(render(t).versions) == {-1, 7}
    assert all(x.tokens_on_version == 1 for x in replies)
    assert all(x.tokens_on_version is None for x in t.turns if x.owner == "teacher")


def test_a_step_logs_the_share_of_its_student_tokens_sampled_before_an_update(chats):
    """learner/trained_student_older_version_share: of the student tokens a step trains, those
    sampled on an older version than their reply's end (tokens_on_version, one per reply here);
    0 when every reply ran on one version."""
    from rose_ray.metrics import trained_scalars
    from rose_ray.tokens import TokenWeights, loss_turns, trained_tokens

    chat, weights = chats["student"], TokenWeights(ce={"teacher": 1.0}, opd={"student": 0.5})

    def share(version_end):
        student = Agent(ScriptedEngine(chat, ["look around", "eat rock"], version_end=version_end), chat, "student")
        teacher = Agent(ScriptedEngine(chat, ["open door", "go to hallway"]), chat, "teacher")
        t = play(student, teacher, turn_policy("on_failure"), game=ScriptedGame(bad=("eat rock",)))
        seq = render(t)
        tokens = trained_tokens([seq], weights)
        scalars = trained_scalars([t], [loss_turns(seq, len(t.turns), weights)], tokens)
        return scalars["learner/trained_student_older_version_share"], tokens["student"]

    share_kept, student_tokens = share(8)
    assert student_tokens > 2 and share_kept == pytest.approx(2 / student_tokens)  # two replies, one token each
    assert share(None)[0] == 0.0


@pytest.mark.parametrize("p0", [0.0, 0.5, 1.0])
def test_decay_takes_over_where_the_seeded_draws_say(chats, p0):
    chat = chats["student"]
    handoff = turn_policy("decay", p0=p0, decay_steps=100)

    def once():
        student = Agent(ScriptedEngine(chat, ["a", "b", "c", "d"]), chat, "student")
        teacher = Agent(ScriptedEngine(chat, ["e", "f", "g", "h"]), chat, "teacher")
        return play(student, teacher, handoff, seed="run0/0/3/sciworld_7")

    t = once()
    expected = next((turn for turn in range(1, 5) if decay_takes_over("run0/0/3/sciworld_7", turn, p0)), None)
    assert t.handoff_turn == expected and t.handoff_p == p0
    assert owners(t) == ["student"] * ((expected or 5) - 1) + ["teacher"] * (4 - (expected or 5) + 1)
    assert (once().handoff_turn, once().handoff_turn) == (expected, expected)  # the same seed decides the same
    if p0 == 1.0:
        assert expected == 1
    if p0 == 0.0:
        assert expected is None


def test_a_teacher_with_another_tokenizer_sees_its_own_ids_and_trains_in_the_students(chats):
    student_chat, teacher_chat = chats["student"], chats["qwen3"]
    assert student_chat.encode("Action: open door") != teacher_chat.encode("Action: open door")
    teacher_engine = ScriptedEngine(teacher_chat, ["open door", "go to hallway"])
    student = Agent(ScriptedEngine(student_chat, ["look around"]), student_chat, "student")
    teacher = Agent(teacher_engine, teacher_chat, "teacher")
    t = play(student, teacher, turn_policy("fixed", k=1), max_turns=3)
    assert owners(t) == ["student", "teacher", "teacher"]
    # The teacher was asked in its own ids: its opening, observations and earlier replies.
    (instruction, ack, obs, reply, obs2) = t.turns[:5]
    assert teacher_engine.requests[0].prompt_ids == (
        teacher_chat.opening_ids([("user", instruction.text), ("assistant", ack.text)])
        + teacher_chat.user_ids(obs.text) + teacher_chat.assistant_ids(reply.text)  # the student's reply, re-encoded
        + teacher_chat.user_ids(obs2.text))
    # The trajectory is in the student's ids: the teacher's replies re-encoded, without logprobs.
    for x in t.turns:
        if x.owner == "teacher":
            assert x.token_ids == student_chat.assistant_ids(x.text) and x.logprobs is None
    seq = render(t)
    assert seq.input_ids == [i for x in t.turns for i in x.token_ids]


def context_dropping(chat: ChatFormat, dropped: int) -> int:
    """A student context (32 new tokens) in which the third prompt of an ["a", "b", "c"]
    episode leaves out `dropped` turns (0 or 2) after the opening and the first observation."""
    free = play(Agent(ScriptedEngine(chat, ["a", "b", "c"]), chat, "student"), None, turn_policy("none"), max_turns=3)
    last_prompt = free.turns[:7]
    return sum(len(x.token_ids) for x in last_prompt) - sum(len(x.token_ids) for x in last_prompt[3 : 3 + dropped]) + 32


def test_the_context_cut_is_recorded_and_the_learner_leaves_it_out(chats):
    chat = chats["student"]
    # The last prompt leaves out 2 turns after the opening and the first observation.
    engine = ScriptedEngine(chat, ["a", "b", "c"])
    student = Agent(engine, chat, "student", ContextSettings(context_dropping(chat, 2), keep_first_turns=1))
    t = play(student, None, turn_policy("none"), max_turns=3)
    assert t.context_cut == [3, 4]
    seq = render(t)
    assert [i for i, _ in seq.turn_spans] == [0, 1, 2, 5, 6, 7, 8]
    assert seq.input_ids == [i for n, x in enumerate(t.turns) if n not in (3, 4) for i in x.token_ids]
    assert engine.requests[-1].prompt_ids == [i for n, x in enumerate(t.turns[:7]) if n not in (3, 4)
                                              for i in x.token_ids]


@pytest.mark.parametrize("policy", ["drop_oldest", "end_episode"])
def test_the_learners_row_and_the_engines_last_prompt_are_one_recorded_cut(chats, policy):
    """A long episode in a small context: under drop_oldest the learner's row, up to the last
    reply, is token for token the engine's last prompt (the cut is decided once, by the
    conversation, and recorded); under end_episode the episode ends where no prompt fits."""
    chat = chats["student"]
    actions = [f"step {n}" for n in range(8)]
    free = play(Agent(ScriptedEngine(chat, actions), chat, "student"), None, turn_policy("none"), max_turns=8)
    lengths = [len(x.token_ids) for x in free.turns]
    # Room for the opening, the first observation, one reply and the observation after it.
    context = sum(lengths[:3]) + max(a + b for a, b in zip(lengths[3::2], lengths[4::2])) + 32
    engine = ScriptedEngine(chat, actions)
    student = Agent(engine, chat, "student", ContextSettings(context, policy))
    t = play(student, None, turn_policy("none"), max_turns=8)
    if policy == "end_episode":
        assert t.end_reason == "context" and t.context_cut == [] and t.rounds == len(engine.requests) == 2
        return
    assert t.rounds == 8 and len(t.context_cut) >= 4
    seq = render(t)
    last_reply = len(t.turns) - 2
    assert [i for i, _ in seq.turn_spans] == [n for n in range(len(t.turns)) if n not in t.context_cut]
    assert engine.requests[-1].prompt_ids == seq.input_ids[: len(seq) - sum(n for i, n in seq.turn_spans
                                                                            if i >= last_reply)]


@pytest.mark.parametrize("dropped", [0, 2])
def test_opd_scores_every_student_token_in_one_pass_over_what_the_learner_trains_on(chats, dropped):
    chat = chats["student"]
    student = Agent(ScriptedEngine(chat, ["a", "b", "c"]), chat, "student", ContextSettings(context_dropping(chat, dropped)))
    teacher_engine = ScriptedEngine(chat, [])
    teacher = Agent(teacher_engine, chat, "teacher")
    t = play(student, teacher, turn_policy("none"), max_turns=3, scored=True)
    assert owners(t) == ["student"] * 3
    for n, x in enumerate(t.turns):
        if x.owner == "student":  # a turn the learner leaves out is not scored
            assert x.teacher_logprobs == (None if n in t.context_cut else [-0.25] * len(x.token_ids))
    # The teacher read the episode once (not once per turn), as the learner will see it: the
    # turns the engine's last prompt left out are left out of the teacher's pass too.
    assert len(teacher_engine.scored) == 1
    seq = render(t)
    prompt, ids = teacher_engine.scored[0]
    assert prompt + ids == seq.input_ids[: len(prompt) + len(ids)]
    first_student = next(a for (i, n), a in zip(seq.turn_spans, _starts(seq)) if t.turns[i].owner == "student")
    assert len(prompt) == first_student
    assert t.timing["teacher_scored_tokens"] == len(prompt) + len(ids) < sum(len(x.token_ids) for x in t.turns)
    assert sum(v == -0.25 for v in seq.teacher_logprobs) == sum(
        len(x.token_ids) for n, x in enumerate(t.turns) if x.owner == "student" and n not in t.context_cut)
    assert len(t.context_cut) == dropped


def _starts(seq) -> list[int]:
    out, at = [], 0
    for _, n in seq.turn_spans:
        out.append(at)
        at += n
    return out


def test_a_new_turn_policy_is_one_class(chats):
    """Adding a handoff policy is one TurnPolicy subclass: the config takes it by name and
    checks its keys, and the episode plays it."""
    from dataclasses import dataclass

    from rose_ray.config import ConfigError, load_config
    from rose_ray.rollout.handoff import TurnPolicy

    @dataclass
    class FromTurn(TurnPolicy):
        policy: str = "from_turn"
        turn: int = 3

        def takes_over(self, turn, state):
            return turn >= self.turn

    try:
        cfg = load_config(None, ["algorithm.handoff.policy=from_turn", "algorithm.handoff.turn=2"])
        assert cfg.algorithm.turn_policy() == FromTurn(turn=2)
        with pytest.raises(ConfigError, match="algorithm.handoff.k: from_turn has no such key"):
            load_config(None, ["algorithm.handoff={policy: from_turn, k: 2}"])
        chat = chats["student"]
        student = Agent(ScriptedEngine(chat, ["a", "b", "c", "d"]), chat, "student")
        teacher = Agent(ScriptedEngine(chat, ["e", "f", "g", "h"]), chat, "teacher")
        t = play(student, teacher, cfg.algorithm.turn_policy())
        assert owners(t) == ["student", "teacher", "teacher", "teacher"] and t.handoff_turn == 2
    finally:
        del TurnPolicy.KINDS["from_turn"]


class ThermometerGame(ScriptedGame):
    """A ScienceWorld-like slot whose thermometer reads `degrees`: ScienceWorld's heat transfer
    runs in a hash set's order, so the same game and actions can read a few degrees apart from
    run to run (envs/sciworld/protocol.py); a JVM cannot be made to drift on demand."""

    def __init__(self, degrees: int) -> None:
        super().__init__()
        self.degrees = degrees

    async def step(self, action: str) -> StepResult:
        if action == "use thermometer on water":
            self.actions.append(action)
            return StepResult(f"the thermometer measures a temperature of {self.degrees} degrees celsius",
                              turn=len(self.actions))
        return await super().step(action)


@pytest.mark.parametrize(("recorded", "kept"), [
    ("the thermometer measures a temperature of 49 degrees celsius", True),  # the drift: the same game
    ("the thermometer measures a temperature of 47 degrees celsius", True),
    ("the thermometer measures a temperature of 49 degrees fahrenheit", False),  # another observation
    ("the ruler measures a length of 47 degrees celsius", False),
])
def test_a_replayed_prefix_is_checked_as_the_world_compares_observations(chats, recorded, kept):
    """`continue` replays a recorded prefix and drops it as tampered where an observation differs
    from the record; a ScienceWorld temperature a few degrees off is the world's own run-to-run
    difference (`Protocol.same_observation`), not tampering: that prefix is continued."""
    chat = chats["student"]
    replay = [Turn("user", "You are in the kitchen.", "env"),
              Turn("assistant", "Thought: measure it.\nAction: use thermometer on water", "student"),
              Turn("user", recorded, "env"), Turn("assistant", "Thought: go on.\nAction: look around", "student"),
              Turn("user", "You did look around.", "env")]
    student = Agent(ScriptedEngine(chat, []), chat, "student")
    teacher = Agent(ScriptedEngine(chat, ["open door"]), chat, "teacher")
    config = EpisodeConfig(max_turns=3, student_sampling=SamplingParams(1.0, 1.0, 32),
                           teacher_sampling=SamplingParams(0.0, 1.0, 32))
    game = ThermometerGame(47)
    episode = run_episode(GAME, game, student, teacher, config, turn_policy("fixed", k=2), replay=replay)
    if not kept:
        with pytest.raises(ReplayMismatch, match="observation after turn 1 differs from the record"):
            asyncio.run(episode)
        assert game.actions == ["use thermometer on water"]  # dropped there: nothing played on
        return
    t = asyncio.run(episode)
    assert game.actions == ["use thermometer on water", "look around", "open door"]
    assert owners(t) == ["student", "student", "teacher"]
