"""`Conversation` (rollout/conversation.py) driven directly, with the tiny tokenizers (built, no
model) and real `Agent`s and `ChatFormat`s, no engine: a prompt that fits is the chat template's
rendering of the conversation tokenized, and is not cut; one that does not fit is cut by
`prompt_for` under the asking agent's own `ContextSettings` (budget = tokens less the
reply's max_new_tokens, an exact fit kept whole; drop_oldest after `keep_first_turns`;
end_episode gives no prompt and leaves the last cut), and the cut is recorded in `conv.cut`
(not with `record=False`); a student and a teacher with their own tokenizers and context
settings each get their own cut of their own ids, each in its own `View`; and the learner's
rendering (`tokens.render` of the trajectory built from `for_learner`'s turns and cut) begins
with exactly the ids of the last prompt, then the reply sampled to it, and leaves out the
observation the episode ended on only where it would not fit the student's context. The report turn's use of the cut:
tests/unit/rollout/test_report.py; the cut's rule on bare turns: tests/unit/rollout/test_context.py."""

from __future__ import annotations

import pytest

from rose_ray.chat import ChatFormat
from rose_ray.envs.protocol import Protocol
from rose_ray.inference.engine import GenerationResult
from rose_ray.provision.tiny import build_tokenizer
from rose_ray.rollout.agent import Agent
from rose_ray.rollout.context import ContextSettings
from rose_ray.rollout.conversation import Conversation
from rose_ray.tokens import render
from rose_ray.types import GameId, Trajectory

PROTOCOL = Protocol(instruction="Play the game.", acknowledgement="OK.")
REPLY_TOKENS = 32  # the max_new_tokens every prompt here leaves room for


@pytest.fixture(scope="module")
def tokenizers():
    """The tiny tokenizers: "plain" (a template that renders history as it was) and "qwen3"
    (one that rewrites earlier replies, as Qwen3's does)."""
    return {"plain": build_tokenizer(), "qwen3": build_tokenizer(style="qwen3")}


def reply(chat: ChatFormat, text: str, version: int = 5) -> GenerationResult:
    """An engine's answer `text` in `chat`'s ids, as the engine samples it (end-of-turn included)."""
    ids = chat.encode(text) + [chat.eos_id]
    return GenerationResult(text, ids, [-0.25] * len(ids), "stop", 0, version)


def play(conv: Conversation, rounds: int, owner: str = "student") -> None:
    """The first observation, then `rounds` replies by `owner`, each followed by an observation."""
    conv.add_text("user", "You are in the kitchen. You see a sink and a stove.")
    for n in range(rounds):
        conv.add_reply(owner, reply(conv.agent(owner).chat, f"Thought: look around.\nAction: look at thing {n}"))
        conv.add_text("user", f"You see thing {n}: it is a red box with {n} apples in it.")


def messages(conv: Conversation) -> list[dict[str, str]]:
    return [{"role": t.role, "content": t.text} for t in conv.turns]


def fit(agent: Agent, tokens: int) -> None:
    """The agent's context set to `tokens` (its other settings kept)."""
    agent.context = ContextSettings(tokens, agent.context.policy, agent.context.keep_first_turns)


def ids_of(turns, left_out=()) -> list[int]:
    return [i for n, t in enumerate(turns) if n not in set(left_out) for i in t.token_ids]


def test_a_prompt_that_fits_is_the_templates_rendering_and_is_not_cut(tokenizers):
    chat = ChatFormat(tokenizers["plain"])
    conv = Conversation(PROTOCOL, Agent(None, chat, "student"), None)
    play(conv, 2)
    conv.cut = [99]  # a previous prompt's cut: a prompt that fits records that it cut nothing
    prompt = conv.prompt_for("student", REPLY_TOKENS)
    assert conv.cut == []
    assert prompt == ids_of(conv.turns)
    # A template that keeps history as it was: the turn pieces are the whole rendering's ids.
    assert prompt == chat.render_ids(messages(conv), add_generation_prompt=True)


def test_template_history_prompts_are_the_templates_rendering_of_the_conversation(tokenizers):
    chat = ChatFormat(tokenizers["qwen3"], history="template")
    assert chat.rewrites_history  # so the sampled pieces would differ from this rendering
    conv = Conversation(PROTOCOL, Agent(None, chat, "student"), None)
    play(conv, 2)
    prompt = conv.prompt_for("student", REPLY_TOKENS)
    assert conv.cut == []
    assert prompt == chat.render_ids(messages(conv), add_generation_prompt=True)


@pytest.mark.parametrize("keep_first_turns, cut", [(1, [3, 4]), (0, [2, 3]), (3, [5, 6])])
def test_a_prompt_over_the_budget_drops_the_oldest_exchange_after_the_kept_turns(tokenizers, keep_first_turns, cut):
    chat = ChatFormat(tokenizers["plain"])
    student = Agent(None, chat, "student", ContextSettings(keep_first_turns=keep_first_turns))
    conv = Conversation(PROTOCOL, student, None)
    play(conv, 4)  # opening (0, 1), observation 2, then (reply, observation) pairs 3..10
    whole = len(ids_of(conv.turns))
    fit(student, whole + REPLY_TOKENS)  # an exact fit: nothing is cut
    assert conv.prompt_for("student", REPLY_TOKENS) == ids_of(conv.turns) and conv.cut == []
    fit(student, whole + REPLY_TOKENS - 1)  # one id over: one exchange goes
    prompt = conv.prompt_for("student", REPLY_TOKENS)
    assert conv.cut == cut
    assert prompt == ids_of(conv.turns, cut)
    assert len(prompt) <= student.context.tokens - REPLY_TOKENS
    kept = [t for n, t in enumerate(conv.turns) if n not in cut]
    assert [t.role for t in kept[2:]] == ["user", "assistant"] * 3 + ["user"]  # still alternating
    assert kept[-1] is conv.turns[-1]  # the observation being answered is never dropped


def test_end_episode_gives_no_prompt_and_keeps_the_last_cut(tokenizers):
    chat = ChatFormat(tokenizers["plain"])
    student = Agent(None, chat, "student", ContextSettings(policy="end_episode"))
    conv = Conversation(PROTOCOL, student, None)
    play(conv, 3)
    conv.cut = ["the last prompt's"]
    fit(student, len(ids_of(conv.turns)) + REPLY_TOKENS - 1)
    assert conv.prompt_for("student", REPLY_TOKENS) is None
    assert conv.cut == ["the last prompt's"]
    # The same conversation under drop_oldest has a cut that fits; unrecorded when asked so.
    student.context = ContextSettings(student.context.tokens, "drop_oldest")
    assert conv.prompt_for("student", REPLY_TOKENS, record=False) == ids_of(conv.turns, [3, 4])
    assert conv.cut == ["the last prompt's"]


def test_student_and_teacher_each_get_their_own_cut_of_their_own_ids(tokenizers):
    student_chat, teacher_chat = ChatFormat(tokenizers["plain"]), ChatFormat(tokenizers["qwen3"])
    student = Agent(None, student_chat, "student", ContextSettings(keep_first_turns=1))
    teacher = Agent(None, teacher_chat, "teacher", ContextSettings(keep_first_turns=0, policy="drop_oldest"))
    conv = Conversation(PROTOCOL, student, teacher)
    assert not conv.shared and conv.views["teacher"].chat is teacher_chat
    play(conv, 4)
    teacher_turns = conv.views["teacher"].turns
    assert len(teacher_turns) == len(conv.turns)  # turn for turn the same conversation
    assert [t.text for t in teacher_turns] == [t.text for t in conv.turns]
    assert ids_of(teacher_turns) != ids_of(conv.turns)
    fit(teacher, len(ids_of(teacher_turns)) + REPLY_TOKENS - 1)
    prompt = conv.prompt_for("teacher", REPLY_TOKENS)
    assert conv.cut == [2, 3] and prompt == ids_of(teacher_turns, [2, 3])
    # The student's context is the default (16384 tokens): its prompt is whole, and it is the
    # cut recorded now (the last prompt's).
    assert conv.prompt_for("student", REPLY_TOKENS) == ids_of(conv.turns) and conv.cut == []
    # The student's own settings: keep_first_turns 1 protects the first observation.
    fit(student, len(ids_of(conv.turns)) + REPLY_TOKENS - 1)
    assert conv.prompt_for("student", REPLY_TOKENS) == ids_of(conv.turns, [3, 4]) and conv.cut == [3, 4]


def test_agents_sharing_a_tokenizer_share_the_ids_and_cut_with_their_own_budgets(tokenizers):
    chat = ChatFormat(tokenizers["plain"])
    student, teacher = Agent(None, chat, "student"), Agent(None, chat, "teacher")
    conv = Conversation(PROTOCOL, student, teacher)
    assert conv.shared and conv.views["teacher"] is conv.views["student"] and conv.views["teacher"].turns is conv.turns
    play(conv, 4)
    whole = len(ids_of(conv.turns))
    fit(student, whole + REPLY_TOKENS - 1)  # one exchange over
    fit(teacher, whole + 64 - 1)  # the teacher leaves room for 64 new tokens
    assert conv.prompt_for("teacher", REPLY_TOKENS) == ids_of(conv.turns) and conv.cut == []
    assert conv.prompt_for("teacher", 64) == ids_of(conv.turns, [3, 4]) and conv.cut == [3, 4]
    assert conv.prompt_for("student", 16) == ids_of(conv.turns) and conv.cut == []


def test_the_learner_renders_the_last_prompt_as_it_was_cut_then_the_reply(tokenizers):
    chat = ChatFormat(tokenizers["plain"])
    student = Agent(None, chat, "student")
    conv = Conversation(PROTOCOL, student, None)
    play(conv, 4)
    fit(student, len(ids_of(conv.turns)) + REPLY_TOKENS - 1)
    prompt = conv.prompt_for("student", REPLY_TOKENS)
    answer = reply(chat, "Thought: done.\nAction: open thing 3", version=7)
    last = conv.add_reply("student", answer)
    conv.add_text("user", "The box is open.")
    turns, cut = conv.for_learner()
    traj = Trajectory(GameId("boil", 0, "sciworld_0"), turns, context_cut=cut)
    seq = render(traj)
    assert traj.context_cut == [3, 4] and seq.dropped_turns == 2  # the observation it ended on fits: kept
    assert len(seq) <= student.context.tokens and seq.turn_spans[-1][0] == len(turns) - 1
    assert seq.input_ids[: len(prompt)] == prompt  # the learner sees what the engine saw
    assert seq.input_ids[len(prompt):len(prompt) + len(last.token_ids)] == answer.token_ids == last.token_ids
    assert last.logprobs == answer.logprobs and last.policy_version == 7
    # Where that observation would not fit the context, the learner's row leaves it out (it
    # predicts nothing) in the same recorded cut; the reply stays.
    fit(student, len(seq) - 1)
    turns, cut = conv.for_learner()
    assert cut == [3, 4, len(turns) - 1]
    assert render(Trajectory(traj.game, turns, context_cut=cut)).input_ids == seq.input_ids[: len(seq) - len(turns[-1].token_ids)]
