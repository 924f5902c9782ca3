"""The AgentGym ReAct protocol for ScienceWorld, in our own words.

A conversation is: the instruction (user), an acknowledgement (assistant), the first
observation (user), then alternating `Thought: ... Action: ...` (assistant) and the game's
observation (user). The instruction can be taken from a dataset's first user message so
that existing data is reproduced exactly.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, replace
from pathlib import Path

# The 24 action forms of the AgentGym instruction (open/close and activate/deactivate pair up).
ACTIONS: tuple[tuple[str, str], ...] = (
    ("open OBJ / close OBJ", "open or close a container or door"),
    ("activate OBJ / deactivate OBJ", "switch a device on or off"),
    ("connect OBJ to OBJ", "join two electrical terminals"),
    ("disconnect OBJ", "remove every electrical connection of an object"),
    ("use OBJ [on OBJ]", "use a tool or device, optionally on something"),
    ("look around", "describe the room you are in"),
    ("look at OBJ", "describe one object closely"),
    ("look in OBJ", "list what a container holds"),
    ("read OBJ", "read a book, note or label"),
    ("move OBJ to OBJ", "put an object somewhere (into a container, onto a surface)"),
    ("pick up OBJ", "take an object into your inventory"),
    ("put down OBJ", "drop an object from your inventory"),
    ("pour OBJ into OBJ", "pour a liquid into a container"),
    ("dunk OBJ into OBJ", "dip a container into a liquid"),
    ("mix OBJ", "stir a container so that its contents combine"),
    ("go to LOC", "walk to a place you can see (doors must be open)"),
    ("eat OBJ", "eat something edible"),
    ("flush OBJ", "flush a toilet"),
    ("focus on OBJ", "declare the object the task is about (a wrong focus can end the task)"),
    ("wait", "let ten steps of time pass"),
    ("wait1", "let one step of time pass"),
    ("examine OBJ", "same as look at"),
    ("task", "repeat the task description"),
    ("inventory", "list what you carry"),
)

INSTRUCTION = (
    "You are an agent in ScienceWorld, a text-based laboratory and household simulation. "
    "Each turn you get an observation of the world and reply with one action that moves you "
    "closer to finishing the task.\n\n"
    "Reply in exactly this format, nothing else:\n"
    "Thought: <your short reasoning about what to do next>\n"
    "Action: <one command from the list below>\n\n"
    "Commands (OBJ and LOC are names as they appear in the observations):\n"
    + "\n".join(f"- {cmd}: {what}" for cmd, what in ACTIONS)
    + "\n\n"
    "If the game asks you to choose between ambiguous objects, answer with the number of the "
    "option as your action. Only one action per turn is carried out."
)

ACKNOWLEDGEMENT = "OK. I will answer with a Thought and one Action each turn."


def first_observation(task_description: str, look_around: str) -> str:
    """The first user turn after the acknowledgement: task, newline, `look around`."""
    return f"{task_description.strip()}\n{look_around.strip()}"


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


INVALID_OBSERVATIONS = ("No known action matches that input.", "Unknown action")


def is_invalid_observation(observation: str) -> bool:
    """The game did not understand the action (it counts as an invalid action)."""
    return observation.strip().startswith(INVALID_OBSERVATIONS)


_LOCATION = re.compile(r"(?:This (?:room|outside location) is called the|You move to the) ([^.\n]+)\.")


def location_of(observation: str) -> str | None:
    """The place an observation says the agent is in ("This room is called the kitchen.",
    "You move to the hallway."), or None when it does not say."""
    found = _LOCATION.findall(observation)
    return found[-1].strip() if found else None


def normalise_score(raw_score: float) -> float:
    """ScienceWorld scores run 0..100, or -100 on failure; normalised is max(score, 0)/100."""
    return max(float(raw_score), 0.0) / 100.0


def is_success(raw_score: float) -> bool:
    return raw_score >= 100


def is_pass(raw_score: float) -> bool:
    return raw_score > 0


@dataclass(frozen=True)
class Protocol:
    """A world's conversation rules: the instruction and acknowledgement that open every
    conversation, and how to tell an observation that says the action was not understood.
    Every world shares the `Thought:`/`Action:` format and `parse_action`.

    `report_question`: asked once more in the same conversation when an episode ends, for
    worlds scored on what the agent says it learned (DiscoveryWorld); None asks nothing."""

    instruction: str = INSTRUCTION
    acknowledgement: str = ACKNOWLEDGEMENT
    invalid_prefixes: tuple[str, ...] = INVALID_OBSERVATIONS
    report_question: str | None = None

    def is_invalid(self, observation: str) -> bool:
        """The game did not understand the action (it counts as an invalid action)."""
        return observation.strip().startswith(self.invalid_prefixes)

    def opening(self) -> list[tuple[str, str]]:
        """(role, text) of the two turns before the first observation."""
        return [("user", self.instruction), ("assistant", self.acknowledgement)]

    def with_opening_of(self, row: dict, where: str = "row") -> Protocol:
        """This protocol with the instruction and acknowledgement of a dataset row (its first
        two messages, in either dataset schema), so a conversation starts exactly as it did."""
        from rose_ray.data import DataError, message_text, validate_conversation

        if not isinstance(row, dict):
            raise DataError(f"{where}: expected a JSON object with 'conversations', got {type(row).__name__}")
        conv = validate_conversation(row.get("conversations"), where)
        roles = [message_text(m)[0] for m in conv[:2]]
        if roles != ["user", "assistant"]:
            raise ValueError(f"{where}: conversations: the first two messages must be the instruction "
                             f"(user) and its acknowledgement (assistant), got {roles}")
        return replace(self, instruction=message_text(conv[0])[1], acknowledgement=message_text(conv[1])[1])

    def from_dataset(self, path: str | Path) -> Protocol:
        """This protocol with the instruction and acknowledgement of a JSONL dataset's first row."""
        path = Path(path)
        if not path.is_file():
            raise ValueError(f"instruction from {path}: no such file")
        with path.open(encoding="utf-8") as f:
            for lineno, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                except json.JSONDecodeError as e:
                    raise ValueError(f"{path}:{lineno}: not valid JSON ({e.msg}); cannot read the "
                                     "instruction from it") from None
                return self.with_opening_of(row, f"{path}:{lineno}")
        raise ValueError(f"{path}: no rows to read an instruction from")
