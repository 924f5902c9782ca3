"""ScienceWorld's expert teacher: from whatever state the student's turns left, it plays the rest
of the game, each plan checked by replay in a scratch game (another JVM) before it is played. It
lives in the EnvPool slot beside the episode's game (`EnvPool.expert_reply`); how it plans:
docs/games.md#the-expert-teacher.
"""

from __future__ import annotations

import re
import time
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from rose_ray.envs.base import ExpertReply, GameError
from rose_ray.envs.protocol import gold_reply
from rose_ray.envs.sciworld.gold import focused_name, visible_names
from rose_ray.envs.sciworld.protocol import location_of, same_but_temperature
from rose_ray.types import GameId

if TYPE_CHECKING:
    from rose_ray.envs.sciworld.game import SciWorldGame

# Tasks bench/expert.py measured the expert on; the config check refuses it on others.
EXPERT_TASKS: tuple[str, ...] = (
    "find-living-thing", "find-non-living-thing", "find-plant", "find-animal",
    "lifespan-longest-lived", "lifespan-shortest-lived", "lifespan-longest-lived-then-shortest-lived",
)
_DOOR = re.compile(r"A door to the (.+?) \(that is (open|closed)\)")
_WALKING = ("open door to ", "close door to ", "go to ")
AMBIGUOUS = "Ambiguous request"
MAX_REPLANS = 4  # per episode
# Per (task, variation), shared by one process's experts: each room's doors, and the gold steps.
DOORS: dict[tuple[str, int], dict[str, list[str]]] = {}
GOLDS: dict[tuple[str, int], Gold] = {}


@dataclass
class Attempt:
    """A candidate plan played in the scratch game after the episode's actions; `replayed`:
    the episode's own actions answered as recorded. The one chosen is the plan."""

    actions: list[str] = field(default_factory=list)
    observations: list[str] = field(default_factory=list)  # what the scratch game answered to each
    raw_score: int = 0
    replayed: bool = True
    start: int = 0  # the episode's action count when it was planned from

    @property
    def won(self) -> bool:
        return self.raw_score >= 100


@dataclass
class Gold:
    """A gold path's task steps (action, its room) with the names the game shows, and with
    ScienceWorld's own referents (played where the shown names are ambiguous)."""

    steps: list[tuple[str, str | None]]
    raw_steps: list[tuple[str, str | None]]
    route: list[str]  # the rooms the path walks through, in order (ties in a walk go its way)


class SciWorldExpert:
    """The expert of one EnvPool slot. `status`: how its last plan stands (verified, partial,
    with `_replay_differed` where the episode's own actions answered otherwise on replay; no_plan,
    unwinnable, scratch_failed)."""

    def __init__(self, heap: str | None, call_timeout_s: float) -> None:
        self.heap, self.call_timeout_s = heap, call_timeout_s
        self.scratch: SciWorldGame | None = None
        self.episode: Any = None  # the slot's load counter of the episode planned for
        self.gold: Gold | None = None
        self.plan: Attempt | None = None
        self.replans = 0
        self.status = ""

    def reply(self, game: GameId, first: str, history: list[tuple[str, str]], episode: Any) -> ExpertReply:
        """The next reply of the episode on `game` (its first observation `first`, then its
        (action, observation) pairs so far); `episode` tells one episode from the next."""
        t0 = time.perf_counter()
        if episode != self.episode:
            self.episode, self.plan, self.replans, self.status = episode, None, 0, ""
        action = self._next_action(history)
        if action is None and self.replans < MAX_REPLANS:
            self.replans += self.plan is not None
            try:
                self.plan = self._plan(game, first, history)
            except GameError:  # the scratch game died: a new one next time, no plan now
                if self.scratch is not None:
                    self.scratch.kill()
                self.scratch, self.plan, self.status = None, None, "scratch_failed"
            action = self._next_action(history)
        location = next(filter(None, map(location_of, [*(o for _, o in reversed(history)), first])), None)
        return ExpertReply(text=None if action is None else gold_reply(action, location), action=action,
                           planned=self.status.startswith(("verified", "partial")),
                           verified=self.status.startswith("verified"), status=self.status,
                           replans=self.replans, plan_s=time.perf_counter() - t0)

    def _next_action(self, history: list[tuple[str, str]]) -> str | None:
        """The plan's next action, while the game has answered its actions so far as the replay did."""
        plan = self.plan
        if plan is None or len(history) - plan.start >= len(plan.actions):
            return None
        done = history[plan.start:]
        planned = zip(plan.actions, plan.observations)
        followed = all(a == p and same_but_temperature(o, e) for (a, o), (p, e) in zip(done, planned))
        return plan.actions[len(done)] if followed else None

    def _plan(self, game: GameId, first: str, history: list[tuple[str, str]]) -> Attempt | None:
        key = (game.task, game.variation)
        doors = self._doors(game)
        now = self._attempt(game, history, [], doors)  # the game where the student left it
        if now.raw_score < 0:  # lost (a wrong focus): nothing can be won from here
            self.status = "unwinnable"
            return None
        focused = _focused(first, history)
        carriers = self._carriers(focused)  # asked of the scratch game in that state
        best: Attempt | None = None
        # The gold path made before, then a new one (a reload can give another path).
        for fresh in (False, True):
            if fresh or key not in GOLDS:
                GOLDS[key] = self._gold(game)
            self.gold = GOLDS[key]
            for steps in self._candidates(focused, history, carriers):
                attempt = self._attempt(game, history, steps, doors)
                if best is None or attempt.raw_score > best.raw_score:  # a win scores above any other
                    best = attempt
                if best.won:
                    break
            if best.won:
                break
        if not best.won and best.raw_score <= now.raw_score:  # nothing scores above where the game is now
            self.status = "no_plan"
            return None
        self.status = "verified" if best.won else "partial"
        if not best.replayed:
            self.status += "_replay_differed"
        best.start = len(history)
        return best

    def _candidates(self, focused: list[tuple[str, str | None]], history: list[tuple[str, str]],
                    carriers: list[list[tuple[str, str | None]]]) -> list[list[tuple[str, str | None]]]:
        """The task's steps to play from here: with what the student focused on taken into account
        (shown names, then the game's referents), then as the gold path has them."""
        gold = self.gold
        # After an ambiguous command the game waits for the option's number: answer it first.
        asked = bool(history) and history[-1][1].startswith(AMBIGUOUS)
        out: list[list[tuple[str, str | None]]] = []
        for steps in (gold.steps, gold.raw_steps):
            for candidate in (*(_after_focus(steps, focused, how) for how in ("stay", "fetch", "bring")),
                              *(_after_focus(steps, carried, how) for carried in carriers for how in ("fetch", "bring")),
                              list(steps)):
                for answer in ([("0", None)], []) if asked else ([],):
                    if answer + candidate not in out:
                        out.append(answer + candidate)
        return out

    def _carriers(self, focused: list[tuple[str, str | None]]) -> list[list[tuple[str, str | None]]]:
        """The student's focused things as they can be carried where one is inside another (up
        to three holders, as the valid actions name them: `cup containing red paint in ...`)."""
        if not focused:
            return []
        valid = [a[len("pick up "):] for a in self.scratch.valid_actions() if a.startswith("pick up ")]
        choices = [sorted((r for r in valid if f"containing {name}" in r), key=len)[:3] for name, _ in focused]
        return [[(holders[i] if i < len(holders) else name, where) for holders, (name, where) in zip(choices, focused)]
                for i in range(max(map(len, choices), default=0))]

    def _loaded(self, game: GameId, gold: bool = False) -> SciWorldGame:
        """The scratch game (a new one if it died), `game` loaded into it."""
        from rose_ray.envs.sciworld.game import SciWorldGame

        if self.scratch is None or not self.scratch.alive():
            self.scratch = SciWorldGame(heap=self.heap, call_timeout_s=self.call_timeout_s)
        self.scratch.load(game, gold=gold)
        return self.scratch

    def _attempt(self, game: GameId, history: list[tuple[str, str]], steps: list[tuple[str, str | None]],
                 doors: dict[str, list[str]]) -> Attempt:
        """The scratch game loaded, the episode's actions played again, then `steps` (each reached by
        a walk to its room)."""
        scratch = self._loaded(game)
        attempt = Attempt()
        for action, observation in history:
            result = scratch.step(action)
            attempt.raw_score = result.raw_score
            if not same_but_temperature(result.observation, observation):
                attempt.replayed = False
        room = location_of(scratch.look())
        moved = _moved_since_look(history)

        def play(action: str) -> bool:
            result = scratch.step(action)
            attempt.actions.append(action)
            attempt.observations.append(result.observation)
            attempt.raw_score = result.raw_score
            return not result.done

        for action, at in steps:
            if at is not None and at != room:
                route = _walk(doors, room, at, self.gold.route)
                if route is None:
                    return attempt
                for next_room in route:
                    closed = dict(_DOOR.findall(scratch.look())).get(next_room) == "closed"
                    if closed and not play(f"open door to {next_room}"):
                        return attempt
                    if not play(f"go to {next_room}"):
                        return attempt
                    if location_of(attempt.observations[-1]) != next_room:
                        return attempt  # the walk failed: this candidate cannot reach its room
                    room, moved = next_room, True
            if action.startswith("focus on") and moved and not play("look around"):
                return attempt
            if action.startswith("focus on") or action == "look around":
                moved = False
            if not play(action):
                return attempt
        return attempt

    def _gold(self, game: GameId) -> Gold:
        """The gold path played from a fresh load, as the task's steps: its actions other than
        walking, up to the win, with focused things renamed as the game names them."""
        scratch = self._loaded(game, gold=True)
        path = scratch.gold_actions()
        room = location_of(scratch.load(game).observation)
        played, observations, rooms, route = [], [], [], [room]
        for action in path:
            result = scratch.step(action)
            played.append(action)
            observations.append(result.observation)
            rooms.append(room)
            if (now := location_of(result.observation)) is not None and now != room and action.startswith("go to"):
                room = now
                route.append(room)
            if result.done:
                break
        shown = visible_names(played, observations)

        def steps(actions: list[str]) -> list[tuple[str, str | None]]:
            return [(a, r) for a, r in zip(actions, rooms) if not a.startswith(_WALKING) and a != "look around"]

        return Gold(steps(shown), steps(played), route)

    def _doors(self, game: GameId) -> dict[str, list[str]]:
        """Each room's doors (room -> the rooms they lead to), read on a walk through the scratch game."""
        key = (game.task, game.variation)
        if key in DOORS:
            return DOORS[key]
        scratch = self._loaded(game)
        doors: dict[str, list[str]] = {}

        def visit() -> None:
            look = scratch.look()
            here = location_of(look)
            found = _DOOR.findall(look)
            doors[here] = [name for name, _ in found]
            for name, state in found:
                if name in doors:
                    continue
                if state == "closed":
                    scratch.step(f"open door to {name}")
                if location_of(scratch.step(f"go to {name}").observation) != name:
                    continue
                visit()
                scratch.step(f"go to {here}")

        visit()
        DOORS[key] = doors
        return doors

    def close(self) -> None:
        if self.scratch is not None:
            self.scratch.close()
        self.scratch = None


def _after_focus(steps: list[tuple[str, str | None]], focused: list[tuple[str, str | None]],
                 how: str = "stay") -> list[tuple[str, str | None]]:
    """The task's steps after the student's focuses: one of the path's focuses dropped per thing
    the student focused on, named in its place after. Where that thing is elsewhere, a later
    `move X to Y` needs them together: `fetch` picks X up first, `bring` carries Y to it."""
    out, renames, away, at = [], {}, {}, 0
    for action, room in steps:
        for old, new in renames.items():
            action = re.sub(rf"(?<!\w){re.escape(old)}(?!\w)", new, action)
        if action.startswith("focus on ") and at < len(focused):
            name, where = focused[at]
            at += 1
            old = action[len("focus on "):].strip()
            if name != old:
                renames[old] = name
                if where is not None and where != room:
                    away[name] = where
            continue
        moved = re.match(r"move (.+) to (.+)$", action)
        if moved and moved.group(1) in away and how != "stay":
            thing, container = moved.groups()
            if how == "fetch":  # once picked up, a thing named by its place is named by the inventory
                held = re.sub(r" in [\w ]+$", " in inventory", thing)
                out += [(f"pick up {thing}", away.pop(thing)), (action.replace(thing, held, 1), room)]
            else:
                out += [(f"pick up {container}", room), (action, away.pop(thing))]
            continue
        out.append((action, room))
    return out


def _focused(first: str, history: list[tuple[str, str]]) -> list[tuple[str, str | None]]:
    """What the student focused on, in order, each with the room it was in (None: not known)."""
    focused, where = [], location_of(first)
    for _, observation in history:
        where = location_of(observation) or where
        if (name := focused_name(observation)) is not None:
            focused.append((name, where))
    return focused


def _moved_since_look(history: list[tuple[str, str]]) -> bool:
    """Whether the agent entered a room and has not looked around (or focused) since."""
    moved = False
    for _, observation in history:
        if observation.startswith("You move to the"):
            moved = True
        elif observation.startswith(("This room is called", "This outside location is called")) or \
                focused_name(observation) is not None:
            moved = False
    return moved


def _walk(doors: dict[str, list[str]], start: str | None, goal: str, prefer: list[str]) -> list[str] | None:
    """The rooms of a shortest walk from `start` to `goal` through the doors (the rooms after
    `start`), going through the gold path's rooms where walks tie; None when there is none."""
    if start is None or start not in doors:
        return None
    if start == goal:
        return []
    rank = {room: i for i, room in enumerate(prefer)}
    previous: dict[str, str | None] = {start: None}
    queue = deque([start])
    while queue:
        room = queue.popleft()
        if room == goal:
            break
        for nxt in sorted(doors.get(room, []), key=lambda r: (rank.get(r, len(rank)), r)):
            if nxt not in previous:
                previous[nxt] = room
                queue.append(nxt)
    if goal not in previous:
        return None
    walk = [goal]
    while previous[walk[-1]] != start:
        walk.append(previous[walk[-1]])
    return walk[::-1]
