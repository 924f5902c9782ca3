"""What every world's conversation shares: a `Protocol` (the instruction and acknowledgement
that open a conversation, how to tell an observation that says the action was not
understood), the `Thought: ... Action: ...` reply format and `parse_action`.

A conversation is: the instruction (user), an acknowledgement (assistant), the first
observation (user), then alternating `Thought: ... Action: ...` (assistant) and the game's
observation (user). The instruction can be taken from a dataset's first user message so
that existing data is reproduced exactly. Each world's own wording is in its package
(`envs/sciworld/protocol.py`, `envs/discoveryworld/protocol.py`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from pathlib import Path

from rose_ray.errors import DataError, InputError
from rose_ray.types import message_text, validate_conversation


@dataclass(frozen=True)
class ParsedAction:
    action: str
    valid_format: bool  # False when there is no `Action:` marker or the action is empty


THINK_BLOCK = re.compile(r"<think>.*?</think>", re.DOTALL)


def strip_thinking(text: str) -> str:
    """A reply without its `<think>…</think>` reasoning (Qwen3's thinking mode). After an
    unclosed `<think>` (the reply ran out of tokens while thinking) nothing is an answer; a
    `</think>` without its opening (templates that put `<think>` in the prompt) ends the
    reasoning, so only what follows the last one is an answer."""
    text = THINK_BLOCK.sub("", text)
    start = text.find("<think>")
    text = text[:start] if start >= 0 else text
    end = text.rfind("</think>")
    return text[end + len("</think>"):] if end >= 0 else text


def parse_action(text: str) -> ParsedAction:
    """The action is the first non-empty line after the last `Action:` marker outside any
    `<think>` block.

    Without a marker, or with nothing after it, the action is empty and `valid_format` is
    False; the game answers it like any other unknown command.
    """
    text = strip_thinking(text)
    marker = text.rfind("Action:")
    if marker < 0:
        return ParsedAction("", False)
    for line in text[marker + len("Action:") :].splitlines():
        if line.strip():
            return ParsedAction(line.strip(), True)
    return ParsedAction("", False)


def parse_thought(text: str) -> str:
    """A reply's thought: what it wrote before its last `Action:` marker (outside any
    `<think>` block), without the `Thought:` label; the whole reply when it has no marker."""
    text = strip_thinking(text)
    marker = text.rfind("Action:")
    before = text[:marker] if marker >= 0 else text
    label = before.find("Thought:")
    return (before[label + len("Thought:"):] if label >= 0 else before).strip()


def gold_thought(action: str, location: str | None = None) -> str:
    """A short templated Thought: where the agent is (copied from the observations, so that a
    small model learns to read the room before it acts) and the action it leads to."""
    where = f"I am in the {location}. " if location else ""
    if action.strip().isdigit():
        return f"{where}The game asks which one I meant; option {action.strip()} is the right one."
    return f"{where}To make progress on the task, I will {action} next."


def gold_reply(action: str, location: str | None = None) -> str:
    """A demonstration's reply in the protocol's form: the templated Thought, then the Action
    (gold rows, and the expert teacher's turns)."""
    return f"Thought: {gold_thought(action, location)}\nAction: {action}"


@dataclass(frozen=True)
class Protocol:
    """A world's conversation rules: the instruction and acknowledgement that open every
    conversation, and how to tell an observation that says the action was not understood.
    Every world shares the `Thought:`/`Action:` format and `parse_action`.

    `report_question`: asked once more in the same conversation when an episode ends, for
    worlds scored on what the agent says it learned (DiscoveryWorld); None asks nothing."""

    instruction: str
    acknowledgement: str
    invalid_prefixes: tuple[str, ...] = ()
    report_question: str | None = None

    def is_invalid(self, observation: str) -> bool:
        """The game did not understand the action (it counts as an invalid action)."""
        return observation.strip().startswith(self.invalid_prefixes)

    def location_of(self, observation: str) -> str | None:
        """The place an observation says the agent is in (for gold Thoughts); None: it does
        not say, or the world does not tell."""
        return None

    def same_observation(self, a: str, b: str) -> bool:
        """Whether two observations of the same game after the same actions agree, as far as the
        world's own run-to-run differences allow (a replayed prefix is checked with it)."""
        return a.strip() == b.strip()

    def opening(self) -> list[tuple[str, str]]:
        """(role, text) of the two turns before the first observation."""
        return [("user", self.instruction), ("assistant", self.acknowledgement)]

    def with_opening_of(self, row: dict, where: str = "row") -> Protocol:
        """This protocol with the instruction and acknowledgement of a dataset row (its first
        two messages, in either dataset schema), so a conversation starts exactly as it did."""
        if not isinstance(row, dict):
            raise DataError(f"{where}: expected a JSON object with 'conversations', got {type(row).__name__}")
        conv = validate_conversation(row.get("conversations"), where)
        roles = [message_text(m)[0] for m in conv[:2]]
        if roles != ["user", "assistant"]:
            raise InputError(f"{where}: conversations: the first two messages must be the instruction "
                             f"(user) and its acknowledgement (assistant), got {roles}")
        return replace(self, instruction=message_text(conv[0])[1], acknowledgement=message_text(conv[1])[1])

    def from_dataset(self, path: str | Path) -> Protocol:
        """This protocol with the instruction and acknowledgement of a JSONL dataset's first row."""
        from rose_ray.files import json_line

        path = Path(path)
        if not path.is_file():
            raise InputError(f"instruction from {path}: no such file")
        with path.open("rb") as f:
            for lineno, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    row = json_line(line, f"{path}:{lineno}")
                except InputError as e:
                    raise InputError(f"{e}; cannot read the instruction from it") from None
                return self.with_opening_of(row, f"{path}:{lineno}")
        raise InputError(f"{path}: no rows to read an instruction from")
