"""The report turn: after an episode's last observation, the agent that acted last is asked what
it discovered (DiscoveryWorld scores the answer as knowledge); no step in the game. The question
joins the last user turn, whose ids already end with the generation prompt.
"""

from __future__ import annotations

import time

from rose_ray.envs.protocol import strip_thinking
from rose_ray.inference.engine import GenerationRequest
from rose_ray.rollout.agent import EpisodeConfig
from rose_ray.rollout.conversation import Conversation, View
from rose_ray.types import Turn


def with_question(observation: str, question: str) -> str:
    """The last observation's text with the report question after it."""
    return f"{observation.rstrip()}\n\n{question}"


async def ask_report(question: str, conv: Conversation, config: EpisodeConfig, request_id: str,
                     timing: dict[str, float]) -> tuple[str, list[Turn]]:
    """(the answer without think blocks, [the last observation with the question, the reply])
    in the student's ids; with no room for a reply, an empty answer and the question alone."""
    turns = conv.turns
    last = turns[-1]
    if last.role != "user":
        raise ValueError("the report question follows an observation (a user turn)")
    last_owner = next((t.owner for t in reversed(turns) if t.role == "assistant" and t.owner != "prompt"), "student")
    owner = "teacher" if conv.teacher is not None and last_owner == "teacher" else "student"
    text = with_question(last.text, question)
    ask = Turn("user", text, last.owner, conv.student.chat.user_ids(text))
    view = conv.views[owner]  # the asking agent reads the question in its own ids
    asked = View(view.chat, view.turns[:-1] + [view.text_turn("user", text, last.owner)], view.cache).rendered()
    sampling = config.teacher_sampling if owner == "teacher" else config.student_sampling
    t0 = time.perf_counter()
    # The conversation's cut, recorded when the learner trains on the answer (report "train").
    prompt = conv.prompt_for(owner, sampling.max_new_tokens, asked, record=config.report == "train")
    if prompt is None:
        timing["report_s"] = time.perf_counter() - t0
        return "", [ask]
    result = await conv.agent(owner).engine.generate.remote(
        GenerationRequest(prompt, sampling.for_turn(request_id, "report"), request_id=request_id))
    timing["report_s"] = time.perf_counter() - t0
    if result.finish_reason == "context":
        return "", [ask]
    reply = conv.views["student"].reply_turn(owner, result, sampled=view is conv.views["student"])
    return strip_thinking(result.text).strip(), [ask, reply]
