"""Making and checking datasets by playing games: `gold`, `collect`, `continue` (a row whose replayed
prefix no longer matches its game is skipped) and `check-data` (docs/configuration.md). Rows stream
into `<out>.partial` (rows.PartialRows); `<out>` is written when every game is done."""

from __future__ import annotations

import dataclasses
import sys
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rose_ray.envs.catalogue import parse_item
from rose_ray.envs.protocol import Protocol
from rose_ray.envs.worlds import get_world, world_of_item, world_protocol
from rose_ray.errors import InputError
from rose_ray.provision.gold import gold_rows
from rose_ray.rows import PartialRows, digest, message_text, read_jsonl, row_to_turns
from rose_ray.types import GameId, Turn, message_schema

if TYPE_CHECKING:
    from rose_ray.commands import CollectCommand, ContinueCommand, GoldCommand
    from rose_ray.rollout.play import PlaySpec


# --------------------------------------------------------------------------- collect / continue
def play_rows(command: str, spec: PlaySpec, games: list[GameId], todo: list[int], stream: PartialRows,
              schema: str, protocols: list[Protocol], replays: list[list[Turn]] | None = None,
              student_flag: str = "--model") -> None:
    """Play the games `todo` names into `stream`, each row as it finishes; a recorded prefix that
    the game no longer matches is named and skipped."""
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


def _replay_turns(row: dict[str, Any]) -> list[Turn]:
    """A row's turns after the opening. An action without an owner is the student's (the card's
    rows name no owners)."""
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
    `live`, each sampled row's task description against the game's under each mapping."""
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
            description = _row_task_description(row) if live else None
            for name, cat in catalogues.items():
                try:
                    g = cat.game(parse_item(row["item_id"], prefix))
                except (KeyError, ValueError):
                    votes[name]["disagree"] += 1
                    continue
                agrees = [row["task"] == g.task] if row.get("task") else []
                if description is not None:
                    game = game or world.game(call_timeout_s=30.0)
                    agrees.append(game.load(g).observation.split("\n", 1)[0].strip() == description)
                for agree in agrees:
                    votes[name]["agree" if agree else "disagree"] += 1
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
def _rows_stream(command: str, args: Any, games: list[GameId], **more: Any) -> tuple[PartialRows, list[int]]:
    """The partial rows of this job (its settings that decide the rows, and the games), and the
    games still to play (by index)."""
    settings = {k: v for k, v in dataclasses.asdict(args).items()
                if k not in ("out", "overwrite", "concurrency", "workers", "kv_cache_mb", "input")}
    job = {"command": command, **settings, "games": digest([g.item_id for g in games]), **more}
    out = Path(args.out)
    if out.is_dir():
        raise InputError(f"--out {out}: a folder; give a file name")
    if out.exists() and not args.overwrite:
        raise InputError(f"--out {out}: already exists; give another --out, or --overwrite to replace it")
    stream = PartialRows(out, job, args.overwrite)
    if stream.done:
        print(f"{command}: resuming {stream.path}: {len(stream.done)} of {len(games)} games already done",
              flush=True)
    return stream, [i for i in range(len(games)) if i not in stream.done]


def _sample(args: Any) -> list[GameId]:
    catalogue = get_world(args.world).catalogue(args.mapping)
    return catalogue.sample(args.split, args.n, args.seed) if args.n else catalogue.split(args.split)


def gold_main(args: GoldCommand) -> int:
    if not get_world(args.world).has_gold:  # before the rows' files are touched (--overwrite clears them)
        raise InputError(f"{args.world} has no gold action paths for any of its games, so there is "
                         "nothing to write; eval, collect and train work without gold demonstrations")
    protocol = world_protocol(args.world, args.instruction_from)
    games = _sample(args)
    stream, todo = _rows_stream("gold", args, games)
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
    protocol = world_protocol(args.world, args.instruction_from)
    games = _sample(args)
    stream, todo = _rows_stream("collect", args, games)
    if todo:
        play_rows("collect", args.play_spec(), games, todo, stream, args.schema, [protocol] * len(games))
    n = stream.finish()
    print(f"collect: wrote {n} student prefixes ({args.turns} turns, {args.schema} schema) to {args.out}")
    return 0


def continue_main(args: ContinueCommand) -> int:
    rows = read_jsonl(args.input)
    if args.world is None and rows:  # the rows' item ids name their world
        args.world = world_of_item(rows[0]["item_id"])
    catalogue = get_world(args.world).catalogue(args.mapping)
    games = [catalogue.game(r["item_id"]) for r in rows]
    replays = [_replay_turns(r) for r in rows]
    # Each row goes on from its own opening, unless --instruction-from names another.
    if args.instruction_from:
        protocols = [world_protocol(args.world, args.instruction_from)] * len(rows)
    else:
        protocol = get_world(args.world).protocol
        protocols = [protocol.with_opening_of(r, f"{args.input} row {n}") for n, r in enumerate(rows, 1)]
    # The games are the input's rows: a partial file of other prefixes is another job.
    stream, todo = _rows_stream("continue", args, games, prefixes=digest(rows))
    if todo:
        play_rows("continue", args.play_spec(), games, todo, stream, args.schema, protocols, replays,
                  student_flag="--student" if args.student else "--teacher")
    n = stream.finish()
    print(f"continue: wrote {n} stitched rows ({args.schema} schema) to {args.out}; {len(rows) - n} skipped")
    return 0


def check_data_main(args) -> int:
    rows = read_jsonl(args.file)
    owners = dict(Counter(m.get("owner", "?") for r in rows for m in r["conversations"]))
    schemas = Counter(message_schema(r["conversations"][0]) for r in rows)
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
