"""DiscoveryWorld in text: the instruction, the observation we show (from the package's
`ui.renderJSON()` dicts), and how a text action (docs/games.md) becomes the package's JSON action;
what cannot be one comes back as an observation `Invalid action: ...`."""

from __future__ import annotations

import re
from typing import Any

from rose_ray.envs.protocol import ACKNOWLEDGEMENT, Protocol, instruction

DIRECTIONS = ("north", "east", "south", "west")
# Ground tiles: listing them would fill the observation; they are never an action's object.
TERRAIN = frozenset({"grass", "floor", "wall", "path", "sand", "fence", "dirt"})
INVALID_PREFIX = "Invalid action"  # ours, and the package's own message for an unparsed action

COMMANDS: tuple[tuple[str, str], ...] = (
    ("move DIR", "walk one tile north, east, south or west"),
    ("face DIR", "turn to face a direction without moving"),
    ("teleport to PLACE", "jump to a named place (listed in the first observation) or beside a visible object"),
    ("pick up OBJ", "take an object in front of you into your inventory"),
    ("drop OBJ", "put an inventory object down where you stand"),
    ("put OBJ in OBJ", "put an object in or on a container, or give it to someone (also: give OBJ to OBJ)"),
    ("open OBJ / close OBJ", "open or close a door or container"),
    ("activate OBJ / deactivate OBJ", "switch a device on or off"),
    ("use OBJ on OBJ", "use a tool or instrument on something (e.g. a meter on a sample)"),
    ("talk to OBJ", "start a conversation with someone in front of you"),
    ("choose N", "pick dialog option N while in a conversation (a bare number works too)"),
    ("read OBJ", "read a book, sign or note"),
    ("eat OBJ", "eat something"),
    ("read feed", "read the latest Discovery Feed posts"),
    ("read post N", "read Discovery Feed post number N"),
    ("done", "end the episode when you think the task is finished"),
)

INSTRUCTION = instruction(
    "You are an agent in DiscoveryWorld, a simulated world where you explore, run "
    "experiments and make scientific discoveries. Each turn you get an observation and "
    "reply with one action.",
    "Commands (OBJ is an object as the observation writes it, `name #id`; a bare name works "
    "when only one object of that name is within reach)",
    COMMANDS,
    "You can only pick up, open, use or talk to objects in your inventory or directly in front "
    "of you; walk or teleport next to an object first. Only one action per turn is carried out.",
)

# Asked when an episode ends: a judge checks the answer against the critical questions.
REPORT_QUESTION = (
    "The episode is over and no more actions will be carried out. Report what you discovered "
    "about the task: state plainly, in a few sentences, the facts, measurements, causes or "
    "answers you found out, as specifically as you can. If you are unsure, say what you think "
    "is most likely and why. Write your findings only, without Thought or Action lines."
)

PROTOCOL = Protocol(INSTRUCTION, ACKNOWLEDGEMENT, invalid_prefixes=(INVALID_PREFIX,),
                    report_question=REPORT_QUESTION)
STOP_ACTION = {"stop": True}  # `done`: ours, never sent to the package


# --------------------------------------------------------------------------- observations
def _obj(o: dict[str, Any]) -> str:
    text = f"{o['name']} #{o['uuid']}"
    desc = str(o.get("description", "")).strip()
    return f"{text} ({desc})" if desc and desc != o["name"] else text


def render_observation(ui: dict[str, Any], action_message: bool = True) -> str:
    """The compact text of one `ui.renderJSON()`: where you are, what you hold, what is in
    reach and nearby (without ground tiles), dialog, feed and the last action's result."""
    loc = ui["agentLocation"]
    lines = []
    if action_message:
        lines.append(f"Result: {ui.get('lastActionMessage') or 'nothing happened.'}")
    extended = str(ui.get("extended_action_message") or "").strip()
    if extended and extended != str(ui.get("lastActionMessage") or "").strip():
        lines.append(extended)
    lines.append(
        f"Step {ui.get('world_steps', 0)}. You are at ({loc['x']}, {loc['y']}) facing "
        f"{loc['faceDirection']}; you can move {', '.join(loc['directions_you_can_move']) or 'nowhere'}."
    )
    inventory = ui.get("inventoryObjects") or []
    lines.append("Inventory: " + ("; ".join(_obj(o) for o in inventory) if inventory else "empty"))
    front = [o for o in ui.get("accessibleEnvironmentObjects") or [] if o["name"] not in TERRAIN]
    lines.append("In front of you: " + ("; ".join(_obj(o) for o in front) if front else "nothing but the ground"))
    nearby = []
    for direction, objs in (ui.get("nearbyObjects", {}).get("objects") or {}).items():
        # Ground tiles, and the agent itself (an `agent` at distance 0), are left out.
        seen = [o for o in objs if o["name"] not in TERRAIN
                and not (o["name"] == "agent" and o.get("distance") == 0)]
        if seen:
            near = sorted(seen, key=lambda o: (o.get("distance", 0), o["uuid"]))
            nearby.append(f"  {direction}: " + "; ".join(f"{o['name']} #{o['uuid']} ({o.get('distance', '?')} away)" for o in near))
    if nearby:
        lines.append("Nearby:\n" + "\n".join(nearby))
    agents = (ui.get("nearbyAgents") or {}).get("list_of_agents") or {}
    lines += [f"Nearby agent {name} recently: {history}" for name, history in agents.items()]
    dialog = ui.get("dialog_box") or {}
    if dialog.get("is_in_dialog"):
        options = "\n".join(f"  {k}. {v}" for k, v in (dialog.get("dialogOptions") or {}).items())
        lines.append(f"In conversation: {dialog.get('dialogIn', '')}\nOptions (choose N):\n{options}")
    posts = (ui.get("discoveryFeed") or {}).get("posts") or []
    lines += [f"Feed post {p.get('postID')} by {p.get('author')}: {p.get('content')}" for p in posts]
    return "\n".join(lines)


def first_observation(ui: dict[str, Any], places: list[str]) -> str:
    """Task description, the named places, then the state."""
    tasks = "\n".join(str(t.get("description", "")).strip() for t in ui.get("taskProgress") or [])
    return (f"Task: {tasks}\nPlaces you can teleport to: {', '.join(places) or 'none'}\n"
            + render_observation(ui, action_message=False))


# --------------------------------------------------------------------------- actions
# (verb phrase, action); the longest phrase that starts the text wins. Underscores read as
# spaces, so the package's own names (PICKUP, MOVE_DIRECTION, ...) work as well.
VERBS: tuple[tuple[str, str], ...] = (
    ("discovery feed get post by id", "POST"), ("discovery feed get updates", "FEED"),
    ("read post", "POST"), ("read feed", "FEED"),
    ("teleport to location", "TELEPORT_TO_LOCATION"), ("teleport to object", "TELEPORT_TO_OBJECT"),
    ("teleport to", "TELEPORT"), ("go to", "TELEPORT"),
    ("move direction", "MOVE_DIRECTION"), ("rotate direction", "ROTATE_DIRECTION"),
    ("move", "MOVE_DIRECTION"), ("face", "ROTATE_DIRECTION"), ("rotate", "ROTATE_DIRECTION"),
    ("pick up", "PICKUP"), ("pickup", "PICKUP"), ("take", "PICKUP"), ("drop", "DROP"),
    ("put", "PUT"), ("give", "PUT"), ("open", "OPEN"), ("close", "CLOSE"),
    ("activate", "ACTIVATE"), ("deactivate", "DEACTIVATE"), ("talk to", "TALK"), ("talk", "TALK"),
    ("eat", "EAT"), ("read", "READ"), ("use", "USE"), ("choose", "CHOOSE"), ("done", "STOP"),
)
_SEPARATORS = {"PUT": (" in ", " into ", " on ", " onto ", " to "), "USE": (" on ", " with ")}
_ID = re.compile(r"#\s*([0-9]+)")
_NUMBER = re.compile(r"[0-9]{1,9}")  # ASCII only: str.isdigit() accepts '²', which int() refuses
MAX_ACTION_CHARS = 500  # longer text is cut: no object name is this long


def _invalid(message: str) -> str:
    return f"{INVALID_PREFIX}: {message}"


def resolve(ref: str, candidates: list[dict[str, Any]], where: str) -> tuple[int | None, str]:
    """The uuid an object reference names among `candidates`, or an error message."""
    ref = ref.strip().strip("'\"`.").strip()
    if not ref:
        return None, "an object is missing"
    by_id = {int(o["uuid"]): o for o in candidates}
    if m := _ID.search(ref):
        uuid = int(m.group(1))
        return (uuid, "") if uuid in by_id else (None, f"no object #{uuid} {where}")
    name = ref.lower()
    hits = sorted({int(o["uuid"]) for o in candidates
                   if name in (str(o["name"]).lower(), str(o.get("description", "")).lower())})
    if len(hits) == 1:
        return hits[0], ""
    if hits:
        shown = ", ".join(f"{by_id[h]['name']} #{h}" for h in hits[:6])
        return None, f"'{ref}' could mean {shown}; add the #id"
    return None, f"no '{ref}' {where}"


def parse_command(text: str, ui: dict[str, Any], places: list[str]) -> dict[str, Any] | str:
    """A text action as the package's JSON action, resolved against the current `ui`, or the
    observation that says why it cannot be one (`Invalid action: ...`)."""
    text = " ".join(str(text).split())[:MAX_ACTION_CHARS]
    if not text:
        return _invalid("empty action. Reply with `Action: <command>`.")
    if _NUMBER.fullmatch(text):  # a bare number is a dialog choice
        text = f"choose {text}"
    low = text.lower().replace("_", " ")
    verb = next(((p, a) for p, a in VERBS if low == p or low.startswith(p + " ")), None)
    if verb is None:
        known = ", ".join(c for c, _ in COMMANDS)
        return _invalid(f"unknown command '{text[:60]}'. Commands: {known}.")
    phrase, action = verb
    rest = text[len(phrase):].strip()
    reach = list(ui.get("inventoryObjects") or []) + list(ui.get("accessibleEnvironmentObjects") or [])
    where = "in your inventory or directly in front of you"

    if action == "STOP":
        if rest:
            return _invalid(f"'done' takes nothing after it, got '{rest[:40]}'.")
        return dict(STOP_ACTION)
    if action == "CHOOSE":
        if not (ui.get("dialog_box") or {}).get("is_in_dialog"):
            return _invalid(f"'{rest[:40]}' is a dialog choice, but you are not in a conversation.")
        if not _NUMBER.fullmatch(rest):
            return _invalid(f"choose needs an option number, got '{rest[:40]}'.")
        return {"chosen_dialog_option_int": int(rest)}
    if action in ("MOVE_DIRECTION", "ROTATE_DIRECTION"):
        direction = {"n": "north", "e": "east", "s": "south", "w": "west"}.get(rest.lower(), rest.lower())
        if direction not in DIRECTIONS:
            return _invalid(f"'{phrase}' needs one of {', '.join(DIRECTIONS)}, got '{rest[:40]}'.")
        return {"action": action, "arg1": direction}
    if action == "FEED":
        return {"action": "DISCOVERY_FEED_GET_UPDATES"}
    if action == "POST":
        if not (m := re.search(r"[0-9]{1,9}", rest)):
            return _invalid(f"'{phrase}' needs a post number, got '{rest[:40]}'.")
        return {"action": "DISCOVERY_FEED_GET_POST_BY_ID", "arg1": int(m.group())}
    if action in ("TELEPORT", "TELEPORT_TO_LOCATION"):
        place = next((p for p in places if p.lower() == rest.lower()), None)
        if place is not None:
            return {"action": "TELEPORT_TO_LOCATION", "arg1": place}
        if action == "TELEPORT_TO_LOCATION":
            return _invalid(f"no place '{rest[:60]}'. Places: {', '.join(places)}.")
    if action in ("TELEPORT", "TELEPORT_TO_OBJECT"):
        visible = reach + [o for objs in (ui.get("nearbyObjects", {}).get("objects") or {}).values() for o in objs]
        uuid, error = resolve(rest, visible, "in sight")
        if uuid is None:
            return _invalid(f"{error}. Teleport to a place ({', '.join(places)}) or to an object as `name #id`.")
        return {"action": "TELEPORT_TO_OBJECT", "arg1": uuid}
    if action in _SEPARATORS and (command := _two_objects(action, phrase, rest, reach, where)):
        return command
    uuid, error = resolve(rest, reach, where)
    if uuid is None:
        return _invalid(f"{error}.")
    return {"action": action, "arg1": uuid}


def _two_objects(action: str, phrase: str, rest: str, reach: list[dict[str, Any]],
                 where: str) -> dict[str, Any] | str | None:
    """`put A in B`, `use A on B`: try each separator position in turn (None: `use A` alone)."""
    low = rest.lower()
    splits = sorted((m.start(), sep) for sep in _SEPARATORS[action]
                    for m in re.finditer(re.escape(sep), low))
    first_error = ""
    for pos, sep in splits:
        a, ea = resolve(rest[:pos], reach, where)
        b, eb = resolve(rest[pos + len(sep):], reach, where)
        if a is not None and b is not None:
            return {"action": action, "arg1": a, "arg2": b}
        first_error = first_error or ea or eb
    if not splits:
        return None if action == "USE" else _invalid(f"'{phrase}' needs two objects: {phrase} OBJ "
                                                      f"{_SEPARATORS[action][0].strip()} OBJ.")
    return _invalid(f"{first_error}.")
