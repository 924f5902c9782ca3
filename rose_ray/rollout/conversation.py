"""One episode's conversation: a `View` per tokenizer, the same turns in its ids (the student's
is what the learner trains on). Each agent's prompt is its view less the context cut decided
once, in `prompt_for`, and recorded in `cut` for the learner and the teacher's scoring.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from rose_ray.chat import ChatFormat, RenderCache
from rose_ray.rollout.agent import Agent
from rose_ray.rollout.context import ContextExceeded
from rose_ray.types import Turn

if TYPE_CHECKING:
    from rose_ray.envs.protocol import Protocol


@dataclass
class TextReply:
    """A reply that no engine sampled (the expert teacher's): text only, no logprobs or version."""

    text: str
    token_ids: None = None
    logprobs: None = None
    finish_reason: str = "stop"
    version: None = None


@dataclass
class View:
    """The conversation in one tokenizer's ids, and its template's last rendering (`cache`)."""

    chat: ChatFormat
    turns: list[Turn]
    cache: RenderCache = field(default_factory=RenderCache)

    def text_turn(self, role: str, text: str, owner: str, truncated: bool = False) -> Turn:
        """A turn from its text (under `template` history without ids: `rendered` gives them)."""
        ids = [] if self.chat.history == "template" else (
            self.chat.user_ids(text) if role == "user" else self.chat.assistant_ids(text))
        return Turn(role, text, owner, ids, truncated=truncated)

    def reply_turn(self, owner: str, result: Any, sampled: bool) -> Turn:
        """An engine's reply: its sampled ids and logprobs where this view's tokenizer `sampled`
        them (the policy version only for the student's), else its text tokenized."""
        if sampled and result.token_ids is not None:
            ids, logprobs = self.chat.finish_sampled(result.token_ids), list(result.logprobs)
            version = result.version if owner == "student" else None
        else:
            ids, logprobs, version = self.chat.assistant_ids(result.text), None, None
        spanned = version is not None and getattr(result, "version_end", None) is not None
        return Turn("assistant", result.text, owner, ids, logprobs, version,
                    truncated=result.finish_reason == "length",
                    policy_version_end=result.version_end if spanned else None,
                    tokens_on_version=getattr(result, "tokens_on_version", None) if spanned else None)

    def rendered(self, generation_prompt: bool = True) -> list[Turn]:
        """The turns as the agent reads them (under `template` history, the template's rendering)."""
        if self.chat.history == "template":
            self.turns[:] = self.chat.apply_template(self.turns, generation_prompt, cache=self.cache)
        return self.turns


class Conversation:
    def __init__(self, protocol: Protocol, student: Agent, teacher: Agent | None) -> None:
        self.student, self.teacher = student, teacher
        (_, instruction), (_, acknowledgement) = opening = protocol.opening()

        def view(chat: ChatFormat) -> View:
            return View(chat, [Turn("user", instruction, "prompt", chat.opening_ids(opening)),
                               Turn("assistant", acknowledgement, "prompt", [])])

        # Agents built with `same_tokenizer` share one ChatFormat: then one view serves both.
        self.shared = teacher is None or teacher.chat is student.chat
        own = view(student.chat)
        self.views = {"student": own, "teacher": own if self.shared else view(teacher.chat)}
        self.distinct = [own] if self.shared else list(self.views.values())  # each view once
        self.cut: list[int] = []  # turns the last prompt left out (`prompt_for`)

    @property
    def turns(self) -> list[Turn]:
        """The student's view: what the learner trains on."""
        return self.views["student"].turns

    def agent(self, owner: str) -> Agent:
        return self.teacher if owner == "teacher" else self.student

    def add_text(self, role: str, text: str, owner: str = "env", truncated: bool = False) -> None:
        """A turn known by its text: an observation, or a recorded reply (a replayed prefix)."""
        for view in self.distinct:
            view.turns.append(view.text_turn(role, text, owner, truncated))

    def add_reply(self, owner: str, result: Any) -> Turn:
        """The engine's reply to `prompt_for(owner)`, joining each view; the student's view's turn."""
        for view in self.distinct:
            view.turns.append(view.reply_turn(owner, result, sampled=view is self.views[owner]))
        return self.turns[-1]

    def prompt_for(self, owner: str, max_new_tokens: int, turns: list[Turn] | None = None,
                   record: bool = True) -> list[int] | None:
        """The prompt ids for the agent playing `owner`: its view rendered (or `turns`) less the
        turns its context leaves out so that `max_new_tokens` fit, recorded in `cut` if `record`.
        None: no cut fits (`cut` then stays the last prompt's)."""
        turns = self.views[owner].rendered() if turns is None else turns
        try:
            cut = self.agent(owner).context.cut(turns, max_new_tokens)
        except ContextExceeded:
            return None
        if record:
            self.cut = cut
        left_out = set(cut)
        return [i for n, t in enumerate(turns) if n not in left_out for i in t.token_ids]

    def for_learner(self) -> tuple[list[Turn], list[int]]:
        """The turns the learner trains on and those it leaves out (`ContextSettings.learner_cut`)."""
        turns = self.views["student"].rendered(generation_prompt=False)
        return turns, self.student.context.learner_cut(turns, self.cut)
