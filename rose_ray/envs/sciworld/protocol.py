"""The AgentGym ReAct protocol for ScienceWorld, in our own words (`PROTOCOL`), and its score."""

from __future__ import annotations

import re

from rose_ray.envs.protocol import ACKNOWLEDGEMENT, Protocol, instruction

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

INSTRUCTION = instruction(
    "You are an agent in ScienceWorld, a text-based laboratory and household simulation. "
    "Each turn you get an observation of the world and reply with one action that moves you "
    "closer to finishing the task.",
    "Commands (OBJ and LOC are names as they appear in the observations)",
    ACTIONS,
    "If the game asks you to choose between ambiguous objects, answer with the number of the "
    "option as your action. Only one action per turn is carried out.",
)


def first_observation(task_description: str, look_around: str) -> str:
    """The first user turn after the acknowledgement: task, newline, `look around`."""
    return f"{task_description.strip()}\n{look_around.strip()}"


# The game did not understand the action (it counts as an invalid action).
INVALID_OBSERVATIONS = ("No known action matches that input.", "Unknown action")


_LOCATION = re.compile(r"(?:This (?:room|outside location) is called the|You move to the) ([^.\n]+)\.")


def location_of(observation: str) -> str | None:
    """The place an observation says the agent is in ("This room is called the kitchen.",
    "You move to the hallway."), or None when it does not say."""
    found = _LOCATION.findall(observation)
    return found[-1].strip() if found else None


# ScienceWorld up to 1.2.3 transfers heat in a hash set's order, which changes from run to run
# (allenai/ScienceWorld#33): the same game and actions can read temperatures a few degrees apart.
_TEMPERATURE = re.compile(r"-?\d+(?:\.\d+)? degrees celsius")


def same_but_temperature(a: str, b: str) -> bool:
    """Whether two observations are the same, temperature readings and outer spaces aside (see above)."""
    a, b = (_TEMPERATURE.sub("T degrees celsius", text.strip()) for text in (a, b))
    return a == b


def normalise_score(raw_score: float) -> float:
    """ScienceWorld scores run 0..100, or -100 on failure; normalised is max(score, 0)/100."""
    return max(float(raw_score), 0.0) / 100.0


def is_success(raw_score: float) -> bool:
    return raw_score >= 100


PROTOCOL = Protocol(INSTRUCTION, ACKNOWLEDGEMENT, invalid_prefixes=INVALID_OBSERVATIONS,
                    location_of=location_of, same_observation=same_but_temperature)
