"""The report turn (rollout/episode.py's `ask_report`) alone, on a real `Conversation` with the
tiny tokenizers and scripted engines: the question goes into the last observation, the agent that acted last
answers with its own sampling and ids, the answer loses its think block, a conversation with
no room left gets an empty answer, and the context cut is recorded only when the learner trains
on the answer. The report on real DiscoveryWorld games: tests/e2e/test_eval_with_a_judge.py."""

from __future__ import annotations

import asyncio

import pytest

from rose_ray.chat import ChatFormat
from rose_ray.envs.protocol import Protocol
from rose_ray.inference.engine import GenerationResult
from rose_ray.models import load_tokenizer
from rose_ray.rollout.agent import Agent, EpisodeConfig
from rose_ray.rollout.context import ContextSettings
from rose_ray.rollout.conversation import Conversation
from rose_ray.rollout.episode import ask_report
from rose_ray.types import SamplingParams

PROTOCOL = Protocol(instruction="Play the game.", acknowledgement="OK.", report_question="What did you find?")
QUESTION = PROTOCOL.report_question
CONFIG = EpisodeConfig(max_turns=4, student_sampling=SamplingParams(1.0, 1.0, 24),
                       teacher_sampling=SamplingParams(0.0, 1.0, 40))


class ScriptedEngine:
    """An engine actor handle (`engine.generate.remote(request)`, awaited) that answers `text`
    in its chat's ids, or finishes with `finish_reason`; it keeps the requests it got."""

    def __init__(self, chat: ChatFormat, text: str = "Thought: done.", finish_reason: str = "stop") -> None:
        self.chat, self.text, self.finish_reason = chat, text, finish_reason
        self.requests = []
        engine = self

        class Generate:
            def remote(self, request):
                async def call():
                    engine.requests.append(request)
                    if engine.finish_reason == "context":
                        return GenerationResult("", [], [], "context", len(request.prompt_ids), 0)
                    ids = engine.chat.encode(engine.text) + [engine.chat.eos_id]
                    return GenerationResult(engine.text, ids, [-0.5] * len(ids), engine.finish_reason,
                                            len(request.prompt_ids), 3)
                return call()

        self.generate = Generate()


@pytest.fixture(scope="module")
def chats(tiny_models, tiny_qwen3):
    return {"tiny": ChatFormat(load_tokenizer(tiny_models["student"])),
            "qwen3": ChatFormat(load_tokenizer(tiny_qwen3["teacher"]))}


def played(student: Agent, teacher: Agent | None, owners: list[str]) -> Conversation:
    """A conversation where `owners` acted in turn, each reply followed by an observation."""
    conv = Conversation(PROTOCOL, student, teacher)
    conv.add_text("user", "You are in the kitchen.")
    for n, owner in enumerate(owners):
        agent = conv.agent(owner)
        text = f"Thought: look.\nAction: look {n}"
        ids = agent.chat.encode(text) + [agent.chat.eos_id]
        conv.add_reply(owner, GenerationResult(text, ids, [-0.5] * len(ids), "stop", 0, 3))
        conv.add_text("user", f"You see room {n}.")
    return conv


def ask(conv: Conversation, config: EpisodeConfig = CONFIG) -> tuple[str, list, dict]:
    timing: dict[str, float] = {}
    answer, turns = asyncio.run(ask_report(QUESTION, conv, config, "game-7", timing))
    return answer, turns, timing


def test_the_student_answers_after_the_last_observation_without_its_think_block(chats):
    chat = chats["tiny"]
    engine = ScriptedEngine(chat, text="<think>the sink is red</think>\nA red sink.")
    conv = played(Agent(engine, chat, "student"), None, ["student"])
    before = list(conv.turns)
    answer, turns, timing = ask(conv)
    assert answer == "A red sink."
    question, reply = turns
    assert question.text == f"You see room 0.\n\n{QUESTION}"
    assert question.role == "user" and question.owner == "env" and question.token_ids == chat.user_ids(question.text)
    assert reply.owner == "student" and reply.text == engine.text and reply.policy_version == 3
    # The question took the last observation's place in the prompt; no step, no turn added.
    [request] = engine.requests
    assert request.prompt_ids == [i for t in before[:-1] for i in t.token_ids] + question.token_ids
    assert request.sampling.max_new_tokens == 24 and request.sampling.temperature == 1.0
    assert conv.turns == before and timing["report_s"] >= 0


def test_the_agent_that_acted_last_answers_with_its_own_sampling(chats):
    chat = chats["tiny"]
    student, teacher = ScriptedEngine(chat), ScriptedEngine(chat)
    agents = Agent(student, chat, "student"), Agent(teacher, chat, "teacher")
    _, [_, reply], _ = ask(played(*agents, ["student", "teacher"]))  # after a handoff: the teacher
    assert reply.owner == "teacher" and not student.requests
    assert teacher.requests[0].sampling.max_new_tokens == 40 and teacher.requests[0].sampling.temperature == 0.0
    _, [_, reply], _ = ask(played(*agents, ["student", "student"]))  # before one: the student
    assert reply.owner == "student" and len(student.requests) == 1 and len(teacher.requests) == 1


def test_a_teacher_with_its_own_tokenizer_reads_the_question_in_its_ids(chats):
    student_chat, teacher_chat = chats["tiny"], chats["qwen3"]
    teacher = ScriptedEngine(teacher_chat, text="Rust.")
    conv = played(Agent(ScriptedEngine(student_chat), student_chat, "student"),
                  Agent(teacher, teacher_chat, "teacher"), ["student", "teacher"])
    answer, [question, reply], _ = ask(conv)
    text = f"You see room 1.\n\n{QUESTION}"
    prompt = teacher.requests[0].prompt_ids
    assert prompt == [i for t in conv.views["teacher"].turns[:-1] for i in t.token_ids] + teacher_chat.user_ids(text)
    # What the trajectory keeps is in the student's ids, the teacher's text re-tokenized.
    assert question.token_ids == student_chat.user_ids(text)
    assert answer == "Rust." and reply.token_ids == student_chat.assistant_ids("Rust.") and reply.logprobs is None


def test_under_template_history_the_question_is_read_as_the_template_renders_it(chats):
    """The asking agent's view rendered with the question in the last observation's place, as a
    chat API renders it (the view's render cache holds the last prompt's rendering)."""
    chat = ChatFormat(chats["qwen3"].tokenizer, history="template")
    assert chat.rewrites_history
    engine = ScriptedEngine(chat, text="<think>hm</think>\nA red sink.")
    conv = played(Agent(engine, chat, "student"), None, ["student", "student"])
    conv.prompt_for("student", 24)  # a turn's prompt, rendered through the view's cache
    answer, [question, _], _ = ask(conv)
    messages = [{"role": t.role, "content": t.text} for t in conv.turns[:-1]] + [
        {"role": "user", "content": question.text}]
    assert engine.requests[-1].prompt_ids == chat.render_ids(messages, add_generation_prompt=True)
    assert answer == "A red sink." and conv.turns[-1].text == "You see room 1."


def test_no_room_for_an_answer_gives_an_empty_one_and_the_question_alone(chats):
    chat = chats["tiny"]
    engine = ScriptedEngine(chat)
    conv = played(Agent(engine, chat, "student", ContextSettings(10, "end_episode")), None, ["student"])
    answer, turns, timing = ask(conv)
    assert (answer, [t.text for t in turns]) == ("", [f"You see room 0.\n\n{QUESTION}"])
    assert not engine.requests and "report_s" in timing
    # The engine found no room either (its own count): the same.
    engine = ScriptedEngine(chat, finish_reason="context")
    answer, turns, _ = ask(played(Agent(engine, chat, "student"), None, ["student"]))
    assert answer == "" and len(turns) == 1 and len(engine.requests) == 1


def test_the_cut_is_recorded_only_when_the_learner_trains_on_the_answer(chats):
    chat = chats["tiny"]
    engine = ScriptedEngine(chat)
    question_ids = len(chat.user_ids(f"You see room 2.\n\n{QUESTION}"))
    for report, recorded in (("ask", False), ("train", True)):
        agent = Agent(engine, chat, "student")
        conv = played(agent, None, ["student", "student", "student"])
        full = sum(len(t.token_ids) for t in conv.turns[:-1]) + question_ids
        agent.context = ContextSettings(full + 24 - 1)  # one id short: drop_oldest leaves out one exchange
        conv.cut = ["before"]
        ask(conv, EpisodeConfig(student_sampling=CONFIG.student_sampling, report=report))
        cut = [3, 4]  # after the opening (0, 1) and the first observation (kept): the first reply and its observation
        assert conv.cut == (cut if recorded else ["before"]), report
        left = set(cut)
        assert engine.requests[-1].prompt_ids == [i for n, t in enumerate(conv.turns[:-1]) if n not in left
                                                  for i in t.token_ids] + chat.user_ids(
                                                      f"You see room 2.\n\n{QUESTION}")


def test_the_question_follows_an_observation_only(chats):
    chat = chats["tiny"]
    conv = played(Agent(ScriptedEngine(chat), chat, "student"), None, ["student"])
    conv.turns.pop()  # the conversation now ends with the student's reply
    with pytest.raises(ValueError, match="follows an observation"):
        ask(conv)
