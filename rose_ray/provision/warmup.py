"""The warm-ups (SFT of the teacher, or the student, on gold demonstrations), cached by their
settings; shipped demonstrations (rose_ray/envs/data/) where some match the settings, since live
gold paths differ between ScienceWorld loads (`rose-ray warmup --ship` writes them)."""

from __future__ import annotations

import gzip
import hashlib
import json
import random
import time
from dataclasses import asdict, replace
from importlib import resources
from pathlib import Path
from typing import Any

from rose_ray.config import TrainConfig, load_config, to_dict
from rose_ray.files import clear_leftovers, locked, temp_name, write_file, writing_folder
from rose_ray.rows import digest, read_jsonl, validate_row, write_jsonl


def resolve_models(cfg: TrainConfig) -> tuple[str, str | None]:
    """Student and teacher model paths, building tiny models and warming them if asked; the
    teacher's is None where the teacher is the world's expert (`teacher.kind: expert`)."""
    from rose_ray.envs.worlds import get_world
    from rose_ray.models import local_model
    from rose_ray.provision.tiny import resolve_tiny

    # A hub id becomes its cached snapshot once, here (a served model's name stays a name).
    models = {role: resolve_tiny(engine.model, cfg.tiny_dir) if engine.spec.served
              else local_model(resolve_tiny(engine.model, cfg.tiny_dir)) for role, engine in cfg.engines()}
    models.setdefault("teacher", None)
    # The student first: a teacher whose demonstrations open with its turns needs it warmed.
    for role in [r for r in ("student", "teacher") if getattr(cfg, f"{r}_warmup").enabled]:
        if get_world(cfg.env.world).has_gold:
            models[role] = warm_model(cfg, models[role], role, student=models["student"])
        else:
            print(f"train: no {role} warm-up: {cfg.env.world} has no gold demonstrations; "
                  f"the {role} is used as it is", flush=True)
    return models["student"], models["teacher"]


DEMONSTRATIONS = "demonstrations.jsonl"  # the rows a warmed model was trained on, in its folder
SHIPPED_GOLD = "tiny_warmup_gold.jsonl"  # in rose_ray/envs/data, with its `.meta.json`
SHIPPED_SUFFIX = "_warmup_gold"  # every shipped file: NAME_warmup_gold.jsonl[.gz] + NAME_warmup_gold.meta.json


def warm_model(cfg: TrainConfig, model: str, role: str = "teacher", student: str | None = None) -> str:
    """SFT a model (the teacher, or the base student) on gold demonstrations of training games
    (the shipped ones where they match the settings, else played now), seeded, cached by its
    settings. Runs sharing the cache warm each model once (`<folder>.lock`, a temp folder
    swapped in whole)."""
    from rose_ray.recipes.sft import train_sft

    key, out = warmup_cache(cfg, model, role)
    if (out / "rose_ray_warmup.json").is_file():
        return str(out)
    with locked(out):
        if (out / "rose_ray_warmup.json").is_file():  # warmed by another run while this one waited
            print(f"train: {role} warmed by another run meanwhile: {out}", flush=True)
            return str(out)
        clear_leftovers(out.parent, out.name, owned=True)  # a stopped warm-up's temp
        rows, source = shipped_gold(key), "shipped"
        if rows is None:
            rows, source = play_gold(cfg, role, student), "played now"
        w, data = getattr(cfg, f"{role}_warmup"), temp_name(out, "gold")
        print(f"train: warming the {role} on {len(rows)} gold demonstrations ({source}) ...", flush=True)

        def log(line: str) -> None:  # "step N/M epoch ..." lines from train_sft, a few of them
            step, total = line.split()[1].split("/")
            if int(step) % 16 == 0 or step == total:
                print(f"train: {role} warm-up {line}", flush=True)

        try:
            with writing_folder(out, "warm-up folder") as tmp:
                write_jsonl(data, rows)
                result = train_sft(data, model, tmp, epochs=w.epochs, batch_size=w.batch_episodes, lr=w.lr,
                                   schedule=w.schedule, max_tokens=cfg.learner.max_tokens, seed=w.seed,
                                   log=log, sft_owners=["teacher"], threads=w.threads)
                # Kept with the weights: the only record of what the model learnt from (and what one ships).
                data.replace(tmp / DEMONSTRATIONS)
                loss, weights = result["history"][-1]["loss"], weights_digest(tmp)
                record = {**key, "gold": source, "final_loss": loss, "weights_sha256": weights}
                (tmp / "rose_ray_warmup.json").write_text(json.dumps(record))
        except FileNotFoundError as e:  # a failed build, not a missing input: keep its traceback (exit 1)
            raise RuntimeError(f"warming the {role} into {out} failed: {e}") from e
        finally:
            data.unlink(missing_ok=True)
    print(f"train: {role} warmed ({result['steps']} steps, loss {loss:.3f}, weights {weights[:12]})")
    return str(out)


def gold_games(cfg: TrainConfig, role: str = "teacher") -> list[Any]:
    """The training games a warm-up demonstrates: the catalogue's sample of its settings."""
    from rose_ray.envs.worlds import get_world

    w = getattr(cfg, f"{role}_warmup")
    catalogue = get_world(cfg.env.world).catalogue(cfg.env.mapping)
    return catalogue.sample(cfg.rollout.split, w.gold_games, w.seed, tasks=cfg.tasks)


def play_gold(cfg: TrainConfig, role: str = "teacher", student: str | None = None) -> list[dict[str, Any]]:
    """Gold demonstrations of a warm-up's `gold_games` training games, played now (the teacher's
    opening with `student`'s own turns where `teacher_warmup.student_openings` asks)."""
    from rose_ray.provision.gold import gold_rows

    w = getattr(cfg, f"{role}_warmup")
    games = gold_games(cfg, role)
    openings = student_openings(cfg, games, student) if role == "teacher" and w.student_openings else None
    rows, problems = gold_rows(games, workers=2, max_actions=w.max_turns, progress=False,
                               protocol=cfg.env.protocol(), observe=w.observe, detours=w.detours, openings=openings,
                               continuation=w.continuation)
    if openings:
        dropped = sum("student's opening" in p for p in problems)
        what = "the gold path" if w.continuation == "gold" else "the expert"
        print(f"train: {len(openings)} of {len(games)} teacher demonstrations open with the base student's "
              f"sampled turns; {len(openings) - dropped} kept ({what} still wins after them)", flush=True)
    if w.continuation == "expert":
        won = sum(bool(r["success"]) for r in rows)
        print(f"train: the expert won {won} of {len(rows)} teacher demonstrations", flush=True)
    return rows


def opening_turns(game: Any, share: float, most: int) -> int:
    """How many of the base student's turns a demonstration of `game` opens with: 0 for a share
    `1 - share` of games, else 1 to `most`. Drawn from the game's id: the same every time."""
    rng = random.Random(f"student-opening:{game.item_id}")
    return rng.randint(1, most) if rng.random() < share else 0


def opening_sampling(cfg: TrainConfig) -> Any:
    """How the base student samples the teacher's demonstration openings: the run's student
    sampling, at `teacher_warmup.opening_temperature` where set."""
    t = cfg.teacher_warmup.opening_temperature
    return cfg.rollout.student_sampling if t is None else replace(cfg.rollout.student_sampling, temperature=t)


def student_openings(cfg: TrainConfig, games: list[Any], student: str | None) -> dict[str, list[str]]:
    """The base student's own first replies (`opening_turns` of them) by item id, played live as a
    run's student plays them."""
    from rose_ray.commands import training_play
    from rose_ray.event_loop import run_coroutine
    from rose_ray.rollout.handoff import StudentOnly
    from rose_ray.rollout.play import play

    if student is None:
        raise ValueError("teacher_warmup.student_openings needs the base student's model")
    w = cfg.teacher_warmup
    turns = {g.item_id: opening_turns(g, w.student_openings, w.opening_turns) for g in games}
    chosen = [g for g in games if turns[g.item_id]]
    if not chosen:
        return {}
    spec = replace(training_play(cfg, student, None), teacher=None, handoff=StudentOnly(), max_turns=w.opening_turns,
                   student_sampling=opening_sampling(cfg), report="off")
    played = run_coroutine(lambda: play(spec, chosen))
    replies = {g.item_id: [u.text for u in t.turns if u.role == "assistant" and u.owner == "student"]
               for g, t in zip(chosen, played)}
    return {item: texts[: turns[item]] for item, texts in replies.items() if texts}


def gold_key(key: dict[str, Any]) -> dict[str, Any]:
    """The settings that decide which gold demonstrations a warm-up uses (no machine's paths)."""
    return {k: key[k] for k in ("world", "tasks", "split", "mapping", "seed", "gold_games", "max_turns", "opening",
                                "games", "observe", "detours", "student_openings", "opening_student",
                                "opening_sampling", "opening_history", "continuation")
            if k in key}  # the last seven only where on


def shipped_gold(key: dict[str, Any]) -> list[dict[str, Any]] | None:
    """The shipped demonstrations made under these settings, else None."""
    want = gold_key(key)
    data_dir = resources.files("rose_ray.envs").joinpath("data")
    for meta in sorted(data_dir.iterdir(), key=lambda f: f.name):
        if not meta.name.endswith(f"{SHIPPED_SUFFIX}.meta.json") or json.loads(meta.read_text()) != want:
            continue
        stem = meta.name.removesuffix(".meta.json")
        with resources.as_file(data_dir) as folder:
            plain = folder / f"{stem}.jsonl"
            return read_jsonl(plain if plain.is_file() else folder / f"{stem}.jsonl.gz")
    return None


def ship_demonstrations(cfg: TrainConfig, out_dir: Path, trained: bool = True) -> list[Path]:
    """Demonstrations for shipping, each with the settings it answers (`gold_key`): those a config's
    warm-ups trained on (built first where missing), gzipped; or, not `trained` (the default
    config), its teacher warm-up's played now (SHIPPED_GOLD)."""
    if trained:
        models = dict(zip(("student", "teacher"), resolve_models(cfg)))
        # gzip without a time stamp: the same bytes every time
        ships = [(f"{cfg.name}_{role}{SHIPPED_SUFFIX}.jsonl.gz", warmup_cache(cfg, model, role)[0],
                  gzip.compress((Path(model) / DEMONSTRATIONS).read_bytes(), mtime=0))
                 for role, model in models.items() if getattr(cfg, f"{role}_warmup").enabled]
    else:
        key, _ = warmup_cache(cfg, "")
        rows = [validate_row(r, f"row {n}") for n, r in enumerate(play_gold(cfg), 1)]
        ships = [(SHIPPED_GOLD, key, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))]
    for name, key, data in ships:
        write_file(out_dir / name, data)
        stem = name.removesuffix(".gz").removesuffix(".jsonl")
        write_file(out_dir / f"{stem}.meta.json", json.dumps(gold_key(key), indent=1) + "\n")
    return [out_dir / name for name, _, _ in ships]


def weights_digest(folder: Path) -> str:
    """sha256 of a model folder's safetensors files: the same teacher on every machine or not."""
    h = hashlib.sha256()
    for f in sorted(Path(folder).glob("*.safetensors")):
        h.update(f.read_bytes())
    return h.hexdigest()


def warmup_cache(cfg: TrainConfig, model: str, role: str = "teacher") -> tuple[dict[str, Any], Path]:
    """The settings a warmed model depends on, and the folder it is cached in."""
    from rose_ray.envs.worlds import get_world

    catalogue = get_world(cfg.env.world).catalogue(cfg.env.mapping)
    opening = digest(cfg.env.protocol().opening())[:10]  # the instruction the demonstrations open with
    # The demonstrated games themselves: a teacher warmed on other games is another teacher.
    games = digest([g.item_id for g in gold_games(cfg, role)])[:10]
    settings = warmup_settings(cfg, role)
    for option in ("observe", "detours"):  # off: the key of every teacher warmed before they existed
        if not settings[option]:
            del settings[option]
    settings.pop("opening_temperature", None)  # in opening_sampling where it counts
    if settings.pop("student_openings", 0):
        settings["student_openings"] = cfg.teacher_warmup.student_openings
        # The student by what it is built from, not its folder: the same on every machine.
        warm = warmup_settings(cfg, "student") if cfg.student_warmup.enabled else None
        settings["opening_student"] = digest({"model": cfg.student_engine.model, "warmup": warm})[:10]
        settings["opening_sampling"] = asdict(opening_sampling(cfg))
        settings["opening_history"] = cfg.chat.history
    else:
        settings.pop("opening_turns", None)
    key = {role: model, "world": cfg.env.world, "tasks": list(cfg.tasks), "split": cfg.rollout.split,
           "mapping": catalogue.mapping, "opening": opening, "games": games, **settings}
    return key, Path(cfg.tiny_dir).expanduser() / f"{role}_warm_{digest(key)[:10]}"


def warmup_settings(cfg: TrainConfig, role: str) -> dict[str, Any]:
    """A warm-up's section as its cache key reads it (`continuation` only where not `gold`,
    keeping older keys)."""
    settings = to_dict(cfg)[f"{role}_warmup"]
    if settings.get("continuation") == "gold":
        del settings["continuation"]
    return settings


def cli_main(args: Any) -> int:
    """`rose-ray warmup`: build a config's models and warm-ups (cached), optionally evaluated."""
    from rose_ray.evaluate import run_eval, train_eval_job

    cfg = load_config(args.config, args.overrides)
    if args.ship:
        here = Path(__file__).parents[1] / "envs" / "data"
        for path in ship_demonstrations(cfg, here, trained=bool(args.config)):
            print(f"warmup: wrote {path}")
        return 0
    t0 = time.time()
    student, teacher = resolve_models(cfg)
    print(f"warmup: built or found in {time.time() - t0:.0f} s (cached under {Path(cfg.tiny_dir).expanduser()})")
    models = [("student", student)] + ([("teacher", teacher)] if teacher is not None else [])
    for role, path in models:
        print(f"  {role}: {path} (weights {weights_digest(Path(path))[:12]})")
    if teacher is None:
        print("  teacher: the world's expert (teacher.kind=expert: no model)")
    if not args.eval:
        return 0
    rows = []
    for role, path in models:
        out = Path(path).with_name(f"{Path(path).name}_eval_{args.eval}")
        result = run_eval(train_eval_job(cfg, path, str(out), split=args.eval, backend=args.backend))
        rows.append((role, result["summary"]["overall"]))
    print(f"\n{cfg.eval.n} games of {args.eval!r}, {cfg.eval.max_turns} turns, greedy")
    print("| model | Score | Success | Pass |\n| --- | ---: | ---: | ---: |")
    for role, o in rows:
        print(f"| {role} | {o['score']:.4f} | {o['success']:.3f} | {o['pass']:.3f} |")
    return 0

