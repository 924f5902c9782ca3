"""Gold demonstrations: each game's gold action path (ScienceWorld's), played and written as a
dataset row (`rose-ray gold`, and the warm-ups' demonstrations), after an opening where asked
(a detour, or a student's own turns), continued by the gold path or the world's expert."""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from rose_ray.envs.base import StepResult
from rose_ray.envs.protocol import Protocol, gold_reply, gold_thought, parse_action
from rose_ray.envs.worlds import CONTINUATIONS, get_world
from rose_ray.errors import InputError
from rose_ray.types import GameId, Trajectory, Turn

Pairs = list[tuple[str, str]]  # (reply or action, the observation after it)


def gold_record(game: GameId, first_observation: str, steps: list[tuple[str, str]],
                last: StepResult, protocol: Protocol, schema: str = "card",
                detour: list[tuple[str, str]] = ()) -> dict[str, Any]:
    """A gold episode as a dataset row (teacher-owned assistant turns), after the `detour`
    replies and observations, if any (student-owned: context that trains nothing)."""
    turns = [Turn("user", protocol.instruction, "prompt"), Turn("assistant", protocol.acknowledgement, "prompt"),
             Turn("user", first_observation, "env")]
    location = protocol.location_of(first_observation)  # the room the replies after the opening name
    played = [("student", pair) for pair in detour] + [("teacher", pair) for pair in steps]
    for owner, (text, observation) in played:
        reply = text if owner == "student" else gold_reply(text, location)  # the teacher's: a gold action
        turns += [Turn("assistant", reply, owner), Turn("user", observation, "env")]
        location = protocol.location_of(observation) or location
    t = Trajectory(game=game, turns=turns, score=last.score, raw_score=last.raw_score,
                   success=last.success, rounds=len(steps))
    return t.to_record(schema)


def detour_replies(game: GameId, rate: float, actions: tuple[str, ...]) -> list[str]:
    """The replies a demonstration opens with before its gold path: none for a share `1 - rate`
    of games; else one or two, each a harmless action of the world's (`actions`) or a cut-off
    reply with no action, as a small student gives. Drawn from the game's id: the same every time."""
    rng = random.Random(f"detour:{game.item_id}")
    if rate <= 0 or rng.random() >= rate:
        return []
    replies = []
    for _ in range(rng.choice((1, 2))):
        action = rng.choice(actions)
        if rng.random() < 0.5:
            replies.append(gold_reply(action))
        else:  # a reply cut before its action: the game gets the thought as its action
            words = gold_thought(action).split()
            replies.append("Thought: " + " ".join(words[: rng.randint(2, len(words) - 1)]))
    return replies


def gold_rows(games: list[GameId], workers: int = 2, max_actions: int = 200, progress: bool = True,
              protocol: Protocol | None = None, schema: str = "card", observe: bool = False,
              detours: float = 0.0, on_row: Callable[[int, dict[str, Any]], None] | None = None,
              openings: dict[str, list[str]] | None = None,
              continuation: str = "gold") -> tuple[list[dict[str, Any]], list[str]]:
    """Play each game's gold path on `workers` game processes; returns (rows, problems).
    `on_row(i, row)` as game i's row is made (on a worker thread).

    `observe`: the world's observed gold paths replayed (the gold path kept where they score
    otherwise). `detours`: the share of demonstrations that open with `detour_replies`.
    `openings`: a game's own student replies (by item id) played first instead, dropped where
    the play after them scores worse than from a fresh load. `continuation`: after the opening,
    the gold path (`gold`) or the world's expert teacher (`expert`). Problems say what was dropped."""
    from rose_ray.envs.pool import EnvPool

    worlds = {g.world for g in games}
    if len(worlds) > 1:
        raise InputError(f"gold: games of several worlds ({sorted(worlds)}); make one dataset per world")
    world = get_world(worlds.pop() if worlds else None)
    if not world.has_gold:
        raise InputError(f"{world.name} has no gold action paths for any of its games, so there are no "
                         "gold demonstrations to write; eval, collect and train work without them")
    if (observe or detours) and world.observed_gold is None:
        raise InputError(f"gold: {world.name} has no observed gold paths or detours (observe, detours); "
                         "use its gold paths as they are")
    if continuation not in CONTINUATIONS:
        raise InputError(f"gold: continuation must be one of {CONTINUATIONS}, got {continuation!r}")
    if continuation == "expert" and world.expert is None:
        raise InputError(f"gold: {world.name} has no expert teacher to continue the demonstrations")
    protocol = protocol or world.protocol
    pool = EnvPool(num_games=max(1, min(workers, len(games))), world=world.name)
    free: list[int] = list(range(pool.num_games()))
    problems: list[str] = []

    def run(slot: int, game: GameId, replies: list[str], gold: bool,
            actions_of: Callable[[int], Iterable[str]]) -> tuple[StepResult, Pairs, Pairs, StepResult | None]:
        """The game loaded (`gold`: with its gold path), its opening `replies` played, then the
        actions `actions_of(slot)` gives, up to `max_actions` or the game's end: the first answer,
        the opening's and the actions' (text, observation) pairs, and the last answer (None: the
        game died). The gold path goes on from the load's answer, the expert from the opening's."""
        first = last = pool.reset(slot, game, gold=gold)
        detour = []
        for reply in replies:
            last = pool.step(slot, parse_action(reply).action)
            detour.append((reply, last.observation))
        result = last if continuation == "expert" else first
        steps: list[tuple[str, str]] = []
        actions = iter(actions_of(slot))
        while len(steps) < max_actions and not result.done:
            action = next(actions, None)
            if action is None:
                break
            result = pool.step(slot, action)
            if result.interrupted:
                return first, detour, steps, None
            steps.append((action, result.observation))
        return first, detour, steps, result

    def play_from(game: GameId, replies: list[str], report_loss: bool = True) -> dict[str, Any] | None:
        slot = free.pop()
        try:
            if continuation == "expert":
                first, detour, steps, result = run(slot, game, replies, False,
                                                   lambda s: iter(lambda: pool.expert_reply(s).action, None))
            else:
                look = world.observed_gold.look_before_focus if observe else list  # the observed gold path
                first, detour, steps, result = run(slot, game, replies, True,
                                                   lambda s: look(pool.gold_actions(s)))
                played = [a for a, _ in steps]
                if result is not None and observe:  # the observed path, where it scores as the gold path
                    renamed = world.observed_gold.visible_names(played, [o for _, o in steps])
                    redo = run(slot, game, replies, False, lambda _: renamed) if renamed != played else None
                    same = redo and redo[3] and (redo[3].raw_score, redo[3].success) == (result.raw_score,
                                                                                       result.success)
                    if same:
                        first, _, steps, result = redo
                    elif redo:
                        problems.append(f"{game.item_id}: the observed path did not score as the gold path; "
                                        "kept gold")
            gold = continuation == "gold"
            if result is None:
                during = "replay" if gold else "the expert's play"
                problems.append(f"{game.item_id}: game process died during {during}")
                return None
            if not result.success and report_loss:
                problems.append(f"{game.item_id}: {'gold path' if gold else 'the expert'} reached {result.raw_score}, "
                                "not success")
            return gold_record(game, first.observation, steps, result, protocol, schema, detour)
        finally:
            free.append(slot)

    def play(i: int, game: GameId) -> dict[str, Any] | None:
        replies = (openings or {}).get(game.item_id)
        if not replies:
            detour = world.observed_gold.DETOURS if detours else ()
            row = play_from(game, detour_replies(game, detours, detour))
        else:
            # A student's opening may have changed the game: its row only where the play after it
            # (the gold path, or the expert) scores as well as from a fresh load.
            clean, row = play_from(game, []), play_from(game, replies, report_loss=False)
            if clean and row and (row["success"], row["score"]) < (clean["success"], clean["score"]):
                what = "the gold path" if continuation == "gold" else "the expert"
                problems.append(f"{game.item_id}: {what} did not score as well after the student's opening; "
                                "demonstrated without it")
                row = None
            row = row or clean
        if row is not None and on_row is not None:
            on_row(i, row)
        return row

    from rose_ray.metrics import progress as progress_bar

    bar = progress_bar(len(games), "gold", "game") if progress else None
    rows = []
    try:
        with ThreadPoolExecutor(max_workers=pool.num_games()) as ex:
            for row in ex.map(play, range(len(games)), games):
                rows.append(row)
                if bar is not None:
                    bar.update(1)
    finally:
        if bar is not None:
            bar.close()
        pool.close()
    return [r for r in rows if r is not None], problems
