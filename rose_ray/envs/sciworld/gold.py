"""Gold paths a model can copy from what it sees: ScienceWorld's act on things the agent has not
looked at and name them by internal referents (`focus on egg giant tortoise` where the game says
"the giant tortoise egg"). The observed path looks around before the first focus after a move
and names each focused thing as the game named it.
"""

from __future__ import annotations

import re

# Actions that change nothing in the game: a demonstration's detour (`provision.gold.detour_replies`)
DETOURS = ("look around", "inventory", "task")
_FOCUSED = re.compile(r"^You focus on (?:the |a |an )?(.+?)\.\s*$")


def look_before_focus(actions: list[str]) -> list[str]:
    """Insert `look around` before the first `focus on` that follows a move with no look since."""
    out: list[str] = []
    moved = False  # the agent arrived somewhere it has not looked at
    for action in actions:
        if action.startswith("focus on") and moved:
            out.append("look around")
        if action.startswith("go to") or action.startswith("teleport to"):
            moved = True
        elif action.startswith("focus on") or action == "look around":
            moved = False
        out.append(action)
    return out


def focused_name(observation: str) -> str | None:
    """The thing an observation says the agent just focused on ("You focus on the baby wolf."
    -> "baby wolf"), or None."""
    found = _FOCUSED.match(observation.strip())
    return found.group(1) if found else None


def visible_names(actions: list[str], observations: list[str]) -> list[str]:
    """`actions` with every focused referent renamed as the game named it on focusing, in that
    action and later ones ("focus on egg giant tortoise" -> "focus on giant tortoise egg")."""
    renames: dict[str, str] = {}
    out = []
    for action, observation in zip(actions, observations, strict=True):
        if action.startswith("focus on "):
            name = focused_name(observation)
            referent = action[len("focus on "):].strip()
            if name is not None and name != referent:
                renames[referent] = name
        for referent, name in renames.items():
            action = re.sub(rf"(?<!\w){re.escape(referent)}(?!\w)", name, action)
        out.append(action)
    return out
