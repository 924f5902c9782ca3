"""Making and checking datasets by playing games: gold demonstrations, student prefixes,
teacher continuations, checks (the row format itself is `rows.py`).

- `rose-ray gold --split train --out gold.jsonl`: ScienceWorld's gold action paths as
  conversations (a short templated Thought before each Action), replayed to check the score.
  A world without gold paths (DiscoveryWorld) says so and writes nothing.
- `rose-ray collect --model M --turns 5 --split train --out prefixes.jsonl`: the student's
  first K turns of each game (temperature 1.0, 512 new tokens by default).
- `rose-ray continue --teacher T --in prefixes.jsonl --max-turns M --out stitched.jsonl`:
  replays each recorded prefix in a fresh game, checks every observation against the record
  (a mismatch is reported and the row skipped), then the teacher plays on to M turns in all.
  Each row is continued from its own instruction and acknowledgement (its first two
  messages), so the teacher continues the very conversation the student had.
- `rose-ray check-data FILE`: schema check with line numbers; which schema (the card's or
  AgentGym's) and which catalogue mapping the rows follow.

Rows are written in the dataset card's schema (`item_id, task, var, score, success, rounds,
conversations` of `role`/`content` messages) unless `--schema agentgym` asks for AgentGym's
`from`/`value` form; each message also keeps its `owner` (prompt, env, student, teacher).
`--instruction-from FILE` takes the instruction and acknowledgement from a dataset's first row.

`collect`, `continue` and `gold` stream each finished game's row into `<out>.partial` (appended
and flushed: a crash or a kill keeps the finished rows) and write `<out>` when every game is
done; rerun the same command to resume (games already there are skipped). An existing `<out>`
is refused unless `--overwrite` (`rows.PartialRows`).
"""

from __future__ import annotations

import dataclasses
import random
import sys
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from rose_ray.envs.base import StepResult
from rose_ray.envs.catalogue import GameCatalogue, parse_item
from rose_ray.envs.protocol import Protocol, gold_reply, gold_thought, parse_action
from rose_ray.envs.worlds import CONTINUATIONS, get_world, world_of_item, world_protocol
from rose_ray.errors import InputError
from rose_ray.rows import PartialRows, digest, message_text, read_jsonl, row_schema, row_to_turns
from rose_ray.types import GameId, Trajectory, Turn

if TYPE_CHECKING:
    from rose_ray.commands import CollectCommand, ContinueCommand, GoldCommand, WorldSettings
    from rose_ray.rollout.play import PlaySpec


# --------------------------------------------------------------------------- gold
def gold_record(game: GameId, first_observation: str, steps: list[tuple[str, str]],
                last: StepResult, protocol: Protocol, schema: str = "card",
                detour: list[tuple[str, str]] = ()) -> dict[str, Any]:
    """A gold episode as a dataset row (teacher-owned assistant turns), after the `detour`
    replies and observations, if any (student-owned: context that trains nothing)."""
    turns = [Turn("user", protocol.instruction, "prompt"), Turn("assistant", protocol.acknowledgement, "prompt"),
             Turn("user", first_observation, "env")]
    for reply, observation in detour:
        turns += [Turn("assistant", reply, "student"), Turn("user", observation, "env")]
    location = protocol.location_of(first_observation)
    for _, observation in detour:  # the replies after it name the room the opening left the agent in
        location = protocol.location_of(observation) or location
    for action, observation in steps:
        turns.append(Turn("assistant", gold_reply(action, location), "teacher"))
        turns.append(Turn("user", observation, "env"))
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

    `observe`: the world's observed gold paths (`World.observed_gold`: look before choosing,
    things named as the game shows them), replayed; a game whose observed path does not score
    as its gold path did keeps the gold path (and says so in problems).
    `detours`: the share of demonstrations that open with one or two student-owned replies
    (`detour_replies`: the world's harmless actions, or a reply with no action) before the gold
    path, so that a teacher warmed on them carries on from a student's first turns.
    `openings`: a game's own student-owned replies (by item id; a student's real sampled turns)
    played before its gold path instead of a detour; where the gold path after them scores
    worse than from a fresh load, the game is demonstrated without them (and says so in problems).
    `continuation`: after the opening, ScienceWorld's gold path (`gold`), or the world's expert
    teacher playing from the state the opening left (`expert`: envs/sciworld/expert.py; its
    replies are already observed ones: it looks before it focuses and names things as shown)."""
    from rose_ray.envs.pool import EnvPool

    worlds = {g.world for g in games}
    for name in worlds:
        if not get_world(name).has_gold:
            raise InputError(f"{name} has no gold action paths for any of its games, so there are no "
                             "gold demonstrations to write; eval, collect and train work without them")
    if len(worlds) > 1:
        raise InputError(f"gold: games of several worlds ({sorted(worlds)}); make one dataset per world")
    world = get_world(worlds.pop() if worlds else None)
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

    def opening(game: GameId) -> list[str]:
        if openings and openings.get(game.item_id):
            return openings[game.item_id]
        return detour_replies(game, detours, world.observed_gold.DETOURS if detours else ())

    def start(slot: int, game: GameId, gold: bool,
              replies: list[str]) -> tuple[StepResult, list[tuple[str, str]], StepResult]:
        """The game loaded, and its opening replies played (a detour or a student's turns): the
        first observation, the opening's (reply, observation) pairs, and the game's last answer."""
        last = first = pool.reset(slot, game, gold=gold)
        pairs = []
        for reply in replies:
            last = pool.step(slot, parse_action(reply).action)
            pairs.append((reply, last.observation))
        return first, pairs, last

    def expert_from(slot: int, last: StepResult) -> tuple[list[tuple[str, str]], StepResult | None]:
        """The expert's play from the slot's state (`last`: the game's last answer), up to
        `max_actions`, until the game ends or the expert has no plan; None if the game died."""
        steps, result = [], last
        while len(steps) < max_actions and not result.done:
            reply = pool.expert_reply(slot)
            if reply.action is None:
                break
            result = pool.step(slot, reply.action)
            if result.interrupted:
                return steps, None
            steps.append((reply.action, result.observation))
        return steps, result

    def replay(slot: int, first: StepResult, actions: list[str]) -> tuple[StepResult, list[tuple[str, str]], Any]:
        steps, result = [], first
        for action in actions:
            result = pool.step(slot, action)
            if result.interrupted:
                return first, steps, None
            steps.append((action, result.observation))
            if result.done:
                break
        return first, steps, result

    def play(i: int, game: GameId) -> dict[str, Any] | None:
        row = play_one(game)
        if row is not None and on_row is not None:
            on_row(i, row)
        return row

    def play_one(game: GameId) -> dict[str, Any] | None:
        replies = opening(game)
        if not (openings and openings.get(game.item_id)):
            return play_from(game, replies)
        # A student's opening may have changed the game: its row only where the play after it
        # (the gold path, or the expert) scores as well as from a fresh load.
        clean = play_from(game, [])
        row = play_from(game, replies, report_loss=False)
        if clean is None or row is None or (row["success"], row["score"]) >= (clean["success"], clean["score"]):
            return row if row is not None else clean
        what = "the gold path" if continuation == "gold" else "the expert"
        problems.append(f"{game.item_id}: {what} did not score as well after the student's opening; "
                        "demonstrated without it")
        return clean

    def gold_from(slot: int, game: GameId, replies: list[str]) -> tuple[StepResult, list[tuple[str, str]],
                                                                        list[tuple[str, str]], StepResult | None]:
        """The game's gold path after the opening (observed where asked): the first observation,
        the opening's pairs, the path's (action, observation) pairs and its last answer."""
        first, detour, _ = start(slot, game, gold=True, replies=replies)
        actions = pool.gold_actions(slot)
        if observe:
            actions = world.observed_gold.look_before_focus(actions)
        first, steps, result = replay(slot, first, actions[:max_actions])
        if result is not None and observe:
            played = [a for a, _ in steps]
            renamed = world.observed_gold.visible_names(played, [o for _, o in steps])
            if renamed != played:
                again = replay(slot, start(slot, game, gold=False, replies=replies)[0], renamed)
                if again[2] is not None and (again[2].raw_score, again[2].success) == (result.raw_score,
                                                                                     result.success):
                    first, steps, result = again
                else:
                    problems.append(f"{game.item_id}: the observed path did not score as the gold path; kept gold")
        return first, detour, steps, result

    def play_from(game: GameId, replies: list[str], report_loss: bool = True) -> dict[str, Any] | None:
        slot = free.pop()
        try:
            if continuation == "expert":
                first, detour, last = start(slot, game, gold=False, replies=replies)
                steps, result = expert_from(slot, last)
            else:
                first, detour, steps, result = gold_from(slot, game, replies)
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


# --------------------------------------------------------------------------- collect / continue
def play_rows(command: str, spec: PlaySpec, games: list[GameId], todo: list[int], stream: PartialRows,
              schema: str, protocols: list[Protocol], replays: list[list[Turn]] | None = None,
              student_flag: str = "--model") -> None:
    """Play the games `todo` names (rollout/play.py) into `stream`, each game's row as it
    finishes; a recorded prefix that the game no longer matches is named and skipped."""
    from rose_ray.event_loop import run_coroutine
    from rose_ray.inference.backends import check_command_engines
    from rose_ray.rollout.episode import ReplayMismatch
    from rose_ray.rollout.play import play

    check_command_engines(command, spec.engines(student_flag))  # a served model that cannot do the job fails now
    with stream:
        played = run_coroutine(lambda: play(
            spec, [games[i] for i in todo], protocols=[protocols[i] for i in todo],
            replays=None if replays is None else [replays[i] for i in todo], skip=(ReplayMismatch,),
            on_done=lambda j, t: stream.add(todo[j], t.to_record(schema))))
    for t in played:
        if isinstance(t, ReplayMismatch):
            print(f"{command}: skipped: {t}", file=sys.stderr)


def _games_of_rows(rows: list[dict[str, Any]], catalogue: GameCatalogue) -> list[GameId]:
    return [catalogue.game(r["item_id"]) for r in rows]


def _replay_turns(row: dict[str, Any]) -> list[Turn]:
    """A row's turns after the opening (first observation, then action/observation pairs).
    A recorded action without an owner is the student's: `continue` goes on from student
    prefixes (the card's rows name no owners)."""
    turns = row_to_turns(row)
    for turn, msg in zip(turns, row["conversations"]):
        if turn.role == "assistant" and turn.owner == "teacher" and msg.get("owner") is None:
            turn.owner = "student"
    start = next((i for i, t in enumerate(turns) if t.owner == "env"), None)
    if start is None:
        raise InputError(f"{row['item_id']}: no observation in the conversation")
    rest = turns[start:]
    if len(rest) % 2 == 0:
        rest = rest[:-1]  # a trailing action without its observation cannot be checked
    return rest


# --------------------------------------------------------------------------- check-data
def detect_mapping(rows: list[dict[str, Any]], sample: int = 20, live: bool = True,
                   world_name: str | None = None) -> dict[str, Any]:
    """Which of a world's mappings the rows' item ids follow: by their `task` fields and, with
    `live`, by comparing each sampled row's task description with the game's under each mapping."""
    world = get_world(world_name)
    votes: dict[str, dict[str, int]] = {m: {"agree": 0, "disagree": 0} for m in world.mappings}
    catalogues = {m: world.catalogue(m) for m in world.mappings}
    prefix = catalogues[world.mappings[0]].item_prefix
    ids = [r for r in rows if str(r["item_id"]).startswith(prefix)]
    # Rows from 1096 on tell the mappings apart (agentgym_traj drops task 2-3 there): check those first.
    ids.sort(key=lambda r: parse_item(r["item_id"], prefix) < 1096)
    checked = ids[: max(sample, 0) or None]
    game = None
    try:
        for row in checked:
            for name, cat in catalogues.items():
                try:
                    g = cat.game(parse_item(row["item_id"], prefix))
                except (KeyError, ValueError):
                    votes[name]["disagree"] += 1
                    continue
                if row.get("task"):
                    votes[name]["agree" if row["task"] == g.task else "disagree"] += 1
                if live:
                    if game is None:
                        game = world.game(call_timeout_s=30.0)
                    description = _row_task_description(row)
                    if description is not None:
                        first = game.load(g).observation.split("\n", 1)[0]
                        votes[name]["agree" if first.strip() == description else "disagree"] += 1
    finally:
        if game is not None:
            game.close()
    fits = [m for m, v in votes.items() if v["agree"] and not v["disagree"]]
    return {"rows_checked": len(checked), "votes": votes, "mapping": fits[0] if len(fits) == 1 else None,
            "consistent_with": fits}


def _row_task_description(row: dict[str, Any]) -> str | None:
    for msg in row["conversations"][1:]:
        role, text = message_text(msg)
        if role == "user" and msg.get("owner") != "prompt":
            return text.split("\n", 1)[0].strip()
    return None


# --------------------------------------------------------------------------- CLI
def _catalogue(args: WorldSettings) -> GameCatalogue:
    return get_world(args.world).catalogue(args.mapping)


def rows_job(command: str, args: Any, games: list[str], **more: Any) -> dict[str, Any]:
    """What makes a partial file of `command` the same job: the settings that decide its rows
    and the games (in order), not where the rows go or how many play at once."""
    settings = {k: v for k, v in dataclasses.asdict(args).items()
                if k not in ("out", "overwrite", "concurrency", "workers", "kv_cache_mb", "input")}
    return {"command": command, **settings, "games": digest(games), **more}


def _resuming(command: str, stream: PartialRows, total: int) -> None:
    if stream.done:
        print(f"{command}: resuming {stream.path}: {len(stream.done)} of {total} games already done", flush=True)


def gold_main(args: GoldCommand) -> int:
    if not get_world(args.world).has_gold:
        raise InputError(f"{args.world} has no gold action paths for any of its games, so there is "
                         "nothing to write; eval, collect and train work without gold demonstrations")
    catalogue = _catalogue(args)
    protocol = world_protocol(args.world, args.instruction_from)
    games = catalogue.sample(args.split, args.n, args.seed) if args.n else catalogue.split(args.split)
    stream = PartialRows(args.out, rows_job("gold", args, [g.item_id for g in games]), args.overwrite)
    _resuming("gold", stream, len(games))
    todo = [i for i in range(len(games)) if i not in stream.done]
    problems: list[str] = []
    if todo:
        with stream:
            _, problems = gold_rows([games[i] for i in todo], workers=args.workers, protocol=protocol,
                                    schema=args.schema, observe=args.observe,
                                    on_row=lambda j, row: stream.add(todo[j], row))
    for p in problems:
        print(f"gold: {p}", file=sys.stderr)
    n = stream.finish()
    rows = stream.done.values()
    print(f"gold: wrote {n} rows ({args.schema} schema) to {args.out} ({sum(r['success'] for r in rows)} succeed)")
    return 0


def collect_main(args: CollectCommand) -> int:
    catalogue = _catalogue(args)
    protocol = world_protocol(args.world, args.instruction_from)
    games = catalogue.sample(args.split, args.n, args.seed) if args.n else catalogue.split(args.split)
    stream = PartialRows(args.out, rows_job("collect", args, [g.item_id for g in games]), args.overwrite)
    _resuming("collect", stream, len(games))
    todo = [i for i in range(len(games)) if i not in stream.done]
    if todo:
        play_rows("collect", args.play_spec(), games, todo, stream, args.schema, [protocol] * len(games))
    n = stream.finish()
    print(f"collect: wrote {n} student prefixes ({args.turns} turns, {args.schema} schema) to {args.out}")
    return 0


def continue_main(args: ContinueCommand) -> int:
    rows = read_jsonl(args.input)
    if args.world is None and rows:  # the rows' item ids name their world
        args.world = world_of_item(rows[0]["item_id"])
    catalogue = _catalogue(args)
    games = _games_of_rows(rows, catalogue)
    replays = [_replay_turns(r) for r in rows]
    # Each row goes on from its own opening, unless --instruction-from names another.
    if args.instruction_from:
        protocols = [world_protocol(args.world, args.instruction_from)] * len(rows)
    else:
        protocol = get_world(args.world).protocol
        protocols = [protocol.with_opening_of(r, f"{args.input} row {n}") for n, r in enumerate(rows, 1)]
    # The games are the input's rows: a partial file of other prefixes is another job.
    stream = PartialRows(args.out, rows_job("continue", args, [g.item_id for g in games], prefixes=digest(rows)),
                         args.overwrite)
    _resuming("continue", stream, len(rows))
    todo = [i for i in range(len(rows)) if i not in stream.done]
    if todo:
        play_rows("continue", args.play_spec(), games, todo, stream, args.schema, protocols, replays,
                  student_flag="--student" if args.student else "--teacher")
    n = stream.finish()
    print(f"continue: wrote {n} stitched rows ({args.schema} schema) to {args.out}; {len(rows) - n} skipped")
    return 0


def check_data_main(args) -> int:
    rows = read_jsonl(args.file)
    owners: dict[str, int] = {}
    for r in rows:
        for m in r["conversations"]:
            owners[m.get("owner", "?")] = owners.get(m.get("owner", "?"), 0) + 1
    schemas: dict[str, int] = {}
    for r in rows:
        schemas[row_schema(r)] = schemas.get(row_schema(r), 0) + 1
    found = ", ".join(f"{SCHEMA_NAMES[k]}: {v} rows" for k, v in schemas.items())
    print(f"{args.file}: {len(rows)} rows, schema OK ({found}); messages by owner: {owners}")
    named = {world_of_item(str(r["item_id"])) for r in rows}
    world = get_world(named.pop() if len(named) == 1 and None not in named else None)
    if len(world.mappings) == 1:
        return _check_one_catalogue(rows, world)
    found = detect_mapping(rows, sample=args.sample, live=not args.no_jvm, world_name=world.name)
    for name, v in found["votes"].items():
        print(f"  mapping {name}: {v['agree']} agree, {v['disagree']} disagree")
    if found["mapping"]:
        print(f"item ids follow the {found['mapping']!r} mapping")
        if args.mapping and args.mapping != found["mapping"]:
            print(f"error: expected the {args.mapping!r} mapping", file=sys.stderr)
            return 1
        return 0
    if len(found["consistent_with"]) > 1:
        print(f"item ids fit every mapping ({found['consistent_with']}): all below 1096, where they agree")
        return 0
    print("error: the item ids fit no mapping: the rows' tasks or task descriptions (the first user turn "
          "after the opening) differ from the games' (see the disagree counts)", file=sys.stderr)
    return 1


SCHEMA_NAMES = {"card": "the card's schema (role/content)", "agentgym": "AgentGym's schema (from/value)"}


def _check_one_catalogue(rows: list[dict[str, Any]], world: Any) -> int:
    """A world with one catalogue (DiscoveryWorld): every row's task must be its item id's game's."""
    catalogue = world.catalogue(None)
    wrong = []
    for n, r in enumerate(rows, 1):
        try:
            game = catalogue.game(r["item_id"])
        except (KeyError, ValueError) as e:
            wrong.append(f"row {n}: {e.args[0]}")
            continue
        if r.get("task") and r["task"] != game.task:
            wrong.append(f"row {n}: {r['item_id']} is {game.task!r}, the row says {r['task']!r}")
    if wrong:
        print(f"error: rows that do not match the {world.name} catalogue:\n  " + "\n  ".join(wrong[:10]),
              file=sys.stderr)
        return 1
    print(f"item ids follow the {world.name!r} catalogue")
    return 0
