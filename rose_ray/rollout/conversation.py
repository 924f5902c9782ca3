"""One episode's conversation: its turns in the student's ids (what the learner trains on) and,
when the two tokenizers differ, the teacher's view of the same turns in its own ids.

It builds each agent's prompt under that agent's chat and context settings, deciding the context
cut there, once, and recording it (`prompt_for`): the engine gets the ids that result, and the
learner, the teacher's scoring and the trajectory read `cut`. It turns an engine's reply into a
turn of each view (the student's ids, logprobs and policy version only where the student's
tokenizer sampled them).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rose_ray.chat import RenderCache
from rose_ray.rollout.agent import Agent
from rose_ray.rollout.context import ContextExceeded, context_cut, prompt_budget
from rose_ray.types import Turn

if TYPE_CHECKING:
    from rose_ray.envs.protocol import Protocol


@dataclass
class TextReply:
    """A reply that no engine sampled (the expert teacher's): text only, so the conversation
    tokenizes it with the student's tokenizer, as it does the text of a teacher whose tokenizer
    differs; no logprobs, no policy version."""

    text: str
    token_ids: None = None
    logprobs: None = None
    finish_reason: str = "stop"
    version: None = None


class Conversation:
    def __init__(self, protocol: Protocol, student: Agent, teacher: Agent | None) -> None:
        self.student, self.teacher = student, teacher
        # Agents built with `same_tokenizer` share one ChatFormat: then one id list serves both.
        self.shared = teacher is None or teacher.chat is student.chat
        (_, instruction), (_, acknowledgement) = opening = protocol.opening()
        self.turns = [Turn("user", instruction, "prompt", student.chat.opening_ids(opening)),
                      Turn("assistant", acknowledgement, "prompt", [])]
        self.teacher_turns: list[Turn] | None = None
        if not self.shared:
            self.teacher_turns = [Turn("user", instruction, "prompt", teacher.chat.opening_ids(opening)),
                                  Turn("assistant", acknowledgement, "prompt", [])]
        self.cut: list[int] = []  # turns the last prompt left out (`prompt_for`)
        # Template history: each view's last rendering, so a prompt tokenizes only its new turns.
        self.rendered = {"student": RenderCache(), "teacher": RenderCache()}

    def view(self, owner: str) -> list[Turn]:
        """The turns in the ids of the agent that plays `owner`."""
        return self.teacher_turns if owner == "teacher" and self.teacher_turns is not None else self.turns

    def add_observation(self, text: str) -> None:
        """An observation, tokenized for each view whose ids are its own (`sampled` history): a
        view under `template` history gets its ids from the template's next rendering (`prompt`,
        `for_learner`), which replaces every turn's, so it is not tokenized twice."""
        student, teacher = self.student.chat, self.teacher.chat if self.teacher is not None else None
        self.turns.append(Turn("user", text, "env", [] if student.history == "template" else student.user_ids(text)))
        if self.teacher_turns is not None:
            self.teacher_turns.append(Turn("user", text, "env",
                                           [] if teacher.history == "template" else teacher.user_ids(text)))

    def add_recorded(self, turn: Turn) -> None:
        """A recorded reply (a replayed prefix), tokenized from its text for each view whose ids
        are its own (as `add_observation`)."""
        student, teacher = self.student.chat, self.teacher.chat if self.teacher is not None else None
        self.turns.append(Turn("assistant", turn.text, turn.owner,
                               [] if student.history == "template" else student.assistant_ids(turn.text),
                               truncated=turn.truncated))
        if self.teacher_turns is not None:
            self.teacher_turns.append(Turn("assistant", turn.text, turn.owner,
                                           [] if teacher.history == "template" else teacher.assistant_ids(turn.text)))

    def prompt(self, owner: str) -> list[Turn]:
        """What the agent playing `owner` reads: its view, rendered by its chat template when its
        history is `template` (as a chat API renders a conversation)."""
        agent, view = self.agent(owner), self.view(owner)
        if agent.chat.history == "template":
            view[:] = agent.chat.apply_template(view, add_generation_prompt=True, cache=self.cache(owner))
        return view

    def prompt_for(self, owner: str, max_new_tokens: int, view: list[Turn] | None = None,
                   record: bool = True) -> list[int] | None:
        """The prompt ids for the agent playing `owner`: its view (`prompt`, or `view`, turn for
        turn the same conversation) less the turns its context policy leaves out so that
        `max_new_tokens` still fit its context. The cut is decided here and recorded in `cut`
        (unless not `record`). None: no cut fits (end_episode, or nothing left to drop); `cut`
        then stays the last prompt's."""
        agent = self.agent(owner)
        view = self.prompt(owner) if view is None else view
        budget = prompt_budget(agent.context_tokens, max_new_tokens)
        try:
            cut = context_cut(view, budget, agent.context_policy, agent.keep_first_turns)
        except ContextExceeded:
            return None
        if record:
            self.cut = cut
        left_out = set(cut)
        return [i for n, t in enumerate(view) if n not in left_out for i in t.token_ids]

    def cache(self, owner: str) -> RenderCache:
        """The render cache of the view `owner`'s agent reads (one id list when it is shared)."""
        return self.rendered["teacher" if owner == "teacher" and self.teacher_turns is not None else "student"]

    def agent(self, owner: str) -> Agent:
        return self.teacher if owner == "teacher" else self.student

    def add_reply(self, owner: str, result: Any) -> Turn:
        """The engine's reply to `prompt_for(owner)`, joining each view. Returns the
        student's-ids turn."""
        turn = self.reply_turn(owner, result)
        self.turns.append(turn)
        if self.teacher_turns is not None:
            by_teacher = owner == "teacher"
            self.teacher_turns.append(Turn("assistant", result.text, owner,
                                           self.teacher.chat.finish_sampled(result.token_ids) if by_teacher
                                           else self.teacher.chat.assistant_ids(result.text)))
        return turn

    def reply_turn(self, owner: str, result: Any) -> Turn:
        """A reply in the student's ids. Sampled ids and logprobs where they are the student's
        tokenizer's (a teacher with another tokenizer: its text re-tokenized, no logprobs); the
        policy version only for the student's own replies. A reply cut at max_new_tokens gets
        its end-of-turn id appended (`truncated`). A reply no engine sampled (`TextReply`, the
        expert's) is its text in the student's ids."""
        by_teacher = owner == "teacher"
        if result.token_ids is None or (by_teacher and not self.shared):
            ids, logprobs, version = self.student.chat.assistant_ids(result.text), None, None  # text only
        else:
            ids, logprobs = self.student.chat.finish_sampled(result.token_ids), list(result.logprobs)
            version = None if by_teacher else result.version
        spanned = version is not None and getattr(result, "version_end", None) is not None
        return Turn("assistant", result.text, owner, ids, logprobs, version,
                    truncated=result.finish_reason == "length",
                    policy_version_end=result.version_end if spanned else None,
                    tokens_on_version=getattr(result, "tokens_on_version", None) if spanned else None)

    def rounds(self) -> int:
        return sum(1 for t in self.turns if t.role == "assistant" and t.owner != "prompt")

    def for_learner(self) -> list[Turn]:
        """The turns the learner trains on: under `template` history, the template's rendering
        of the whole conversation."""
        if self.student.chat.history == "template":
            self.turns[:] = self.student.chat.apply_template(self.turns, add_generation_prompt=False,
                                                             cache=self.cache("student"))
        return self.turns
