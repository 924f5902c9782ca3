"""What every world's conversation shares: a `Protocol` (the instruction, its acknowledgement, the
first observation, then replies and observations) and the `Thought: ... Action: ...` reply format."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from rose_ray.errors import DataError, InputError
from rose_ray.types import message_text, validate_conversation

ACKNOWLEDGEMENT = "OK. I will answer with a Thought and one Action each turn."


def instruction(intro: str, commands_title: str, commands: tuple[tuple[str, str], ...], rules: str) -> str:
    """A world's instruction: its intro, the reply format, its commands, then its rules."""
    listed = "\n".join(f"- {cmd}: {what}" for cmd, what in commands)
    return (f"{intro}\n\nReply in exactly this format, nothing else:\n"
            "Thought: <your short reasoning about what to do next>\n"
            f"Action: <one command from the list below>\n\n{commands_title}:\n{listed}\n\n{rules}")


@dataclass(frozen=True)
class ParsedAction:
    action: str
    valid_format: bool  # False when there is no `Action:` marker or the action is empty


THINK_BLOCK = re.compile(r"<think>.*?</think>", re.DOTALL)


def strip_thinking(text: str) -> str:
    """A reply without its `<think>…</think>` reasoning: nothing after an unclosed `<think>` (it
    ran out of tokens), and only what follows a lone `</think>` (a template opened it)."""
    text = THINK_BLOCK.sub("", text)
    start = text.find("<think>")
    text = text[:start] if start >= 0 else text
    end = text.rfind("</think>")
    return text[end + len("</think>"):] if end >= 0 else text


def parse_action(text: str) -> ParsedAction:
    """The first non-empty line after the last `Action:` marker outside any `<think>` block;
    without one, an empty action with `valid_format` False."""
    _, marker, after = strip_thinking(text).rpartition("Action:")
    action = next((line.strip() for line in after.splitlines() if line.strip()), "") if marker else ""
    return ParsedAction(action, bool(action))


def parse_thought(text: str) -> str:
    """A reply's thought: what it wrote before its last `Action:` marker (outside any
    `<think>` block), without the `Thought:` label; the whole reply when it has no marker."""
    before, marker, after = strip_thinking(text).rpartition("Action:")
    before = before if marker else after
    label = before.find("Thought:")
    return (before[label + len("Thought:"):] if label >= 0 else before).strip()


def gold_thought(action: str, location: str | None = None) -> str:
    """A short templated Thought: where the agent is (so a small model learns to read the room)
    and the action it leads to."""
    where = f"I am in the {location}. " if location else ""
    if action.strip().isdigit():
        return f"{where}The game asks which one I meant; option {action.strip()} is the right one."
    return f"{where}To make progress on the task, I will {action} next."


def gold_reply(action: str, location: str | None = None) -> str:
    """A demonstration's reply: the templated Thought, then the Action."""
    return f"Thought: {gold_thought(action, location)}\nAction: {action}"


def _nowhere(observation: str) -> None:
    return None


def _same_text(a: str, b: str) -> bool:
    return a.strip() == b.strip()


@dataclass(frozen=True)
class Protocol:
    """A world's conversation rules: the opening, how to tell an observation that says the
    action was not understood, and `report_question`, asked when an episode ends (None: none)."""

    instruction: str
    acknowledgement: str
    invalid_prefixes: tuple[str, ...] = ()
    report_question: str | None = None
    # The place an observation says the agent is in (for gold Thoughts), or None.
    location_of: Callable[[str], str | None] = _nowhere
    # Whether two observations of the same game after the same actions agree, up to the world's
    # own run-to-run differences.
    same_observation: Callable[[str, str], bool] = _same_text

    def is_invalid(self, observation: str) -> bool:
        """The game did not understand the action (it counts as an invalid action)."""
        return observation.strip().startswith(self.invalid_prefixes)

    def opening(self) -> list[tuple[str, str]]:
        """(role, text) of the two turns before the first observation."""
        return [("user", self.instruction), ("assistant", self.acknowledgement)]

    def with_opening_of(self, row: dict, where: str = "row") -> Protocol:
        """This protocol with the opening of a dataset row (its first two messages)."""
        if not isinstance(row, dict):
            raise DataError(f"{where}: expected a JSON object with 'conversations', got {type(row).__name__}")
        conv = validate_conversation(row.get("conversations"), where)
        roles = [message_text(m)[0] for m in conv[:2]]
        if roles != ["user", "assistant"]:
            raise InputError(f"{where}: conversations: the first two messages must be the instruction "
                             f"(user) and its acknowledgement (assistant), got {roles}")
        return replace(self, instruction=message_text(conv[0])[1], acknowledgement=message_text(conv[1])[1])

    def from_dataset(self, path: str | Path) -> Protocol:
        """This protocol with the opening of a JSONL dataset's first row."""
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
