"""The tiny default's teacher warm-up: shipped gold demonstrations, held-out games kept out."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rose_ray.config import load_config
from rose_ray.envs.protocol import parse_action
from rose_ray.envs.sciworld.catalogue import SciWorldCatalogue
from rose_ray.envs.sciworld.game import SciWorldGame
from rose_ray.recipes.warmup import DEMONSTRATIONS, shipped_gold, warmup_cache
from rose_ray.rows import read_jsonl


def test_the_tiny_default_warms_on_the_shipped_demonstrations():
    cfg = load_config(None)
    rows = shipped_gold(warmup_cache(cfg, "")[0])
    assert rows is not None and len(rows) == cfg.teacher_warmup.gold_games
    catalogue = SciWorldCatalogue(cfg.env.mapping)
    games = [catalogue.game(r["item_id"]) for r in rows]
    # They are the games the warm-up would play now: the catalogue's sample of its settings.
    w = cfg.teacher_warmup
    assert games == catalogue.sample(cfg.rollout.split, w.gold_games, w.seed, tasks=cfg.tasks)
    assert {g.task for g in games} == set(cfg.tasks)
    assert {catalogue.split_of(g) for g in games} == {"train"}
    # The held-out games the run evaluates on are never demonstrated.
    held_out = {g.item_id for g in catalogue.sample(cfg.eval.split, cfg.eval.n, cfg.eval.seed, tasks=cfg.tasks)}
    assert len(held_out) == cfg.eval.n >= 16 and not held_out & {g.item_id for g in games}
    # Every demonstration opens with the instruction the run uses, and acts within the cut.
    opening = cfg.env.protocol().opening()
    for r in rows:
        assert [(m["role"], m["content"]) for m in r["conversations"][:2]] == opening
        assert 1 <= r["rounds"] <= cfg.teacher_warmup.max_turns


def test_the_shipped_demonstrations_still_match_the_games():
    """A ScienceWorld release that changed these games would make the shipped data a lie."""
    cfg = load_config(None)
    rows = shipped_gold(warmup_cache(cfg, "")[0])
    catalogue = SciWorldCatalogue(cfg.env.mapping)
    with SciWorldGame() as game:
        for row in rows[:: len(rows) // 3][:3]:
            first = game.load(catalogue.game(row["item_id"]))
            conv = row["conversations"]
            assert first.observation == conv[2]["content"]
            for action, observation in zip(conv[3::2], conv[4::2]):
                step = game.step(parse_action(action["content"]).action)
                assert step.observation == observation["content"]


def test_other_settings_play_gold_now():
    for override in ("teacher_warmup.gold_games=8", "teacher_warmup.max_turns=4", "teacher_warmup.seed=1",
                     "tasks=[boil]", "rollout.split=dev"):
        cfg = load_config(None, [override])
        assert shipped_gold(warmup_cache(cfg, "")[0]) is None, override


def test_the_warm_up_cache_key_names_what_the_teacher_depends_on(tmp_path):
    base = warmup_cache(load_config(None, [f"tiny_dir={tmp_path}"]), "t")[1]
    assert base.parent == tmp_path
    for override in ("teacher_warmup.lr=1e-3", "teacher_warmup.schedule=constant", "teacher_warmup.seed=2"):
        assert warmup_cache(load_config(None, [f"tiny_dir={tmp_path}", override]), "t")[1] != base, override
    # The run's own seed (game order, learner) does not change the teacher: seeds share it.
    assert warmup_cache(load_config(None, [f"tiny_dir={tmp_path}", "seed=3"]), "t")[1] == base
    instruction = tmp_path / "i.jsonl"
    instruction.write_text(json.dumps({"conversations": [{"role": "user", "content": "I"},
                                                         {"role": "assistant", "content": "A"}]}) + "\n")
    other = load_config(None, [f"tiny_dir={tmp_path}", f"env.instruction_from={instruction}"])
    assert warmup_cache(other, "t")[1] != base
    assert shipped_gold(warmup_cache(other, "t")[0]) is None  # the shipped rows open otherwise


@pytest.mark.slow
def test_the_warm_up_trains_on_the_shipped_rows_and_is_cached(tmp_path, ray_cluster):
    """A one-step warm-up (all 128 shipped rows in one batch, cut to 1,024 tokens, which is not
    part of the gold key) through resolve_models, then the cache: no second warm-up."""
    from rose_ray.recipes.warmup import resolve_models

    short = ["teacher_warmup.epochs=1", "teacher_warmup.batch_episodes=128", "learner.max_tokens=1024",
             "student_engine.context_tokens=1024"]
    cfg = load_config(None, [f"tiny_dir={tmp_path}", *short])
    _, teacher = resolve_models(cfg)
    info = json.loads((tmp_path / teacher.rsplit("/", 1)[1] / "rose_ray_warmup.json").read_text())
    assert info["gold"] == "shipped" and 0 < info["final_loss"] < 20 and len(info["weights_sha256"]) == 64
    # the rows it learnt from are kept beside the weights: the shipped ones, all of them
    kept = read_jsonl(tmp_path / teacher.rsplit("/", 1)[1] / DEMONSTRATIONS)
    assert kept == shipped_gold(warmup_cache(cfg, "t")[0])
    stamp = (tmp_path / teacher.rsplit("/", 1)[1]).stat().st_mtime_ns
    assert resolve_models(load_config(None, [f"tiny_dir={tmp_path}", *short]))[1] == teacher
    assert (tmp_path / teacher.rsplit("/", 1)[1]).stat().st_mtime_ns == stamp


@pytest.mark.slow
def test_the_warm_up_sft_is_the_same_teacher_twice(tmp_path, ray_cluster, tiny_models):
    """The warm-up's SFT, seeded, run twice on 8 shipped rows: the same weights digest (what
    makes the tiny teacher the same on every machine)."""
    from rose_ray.recipes.sft import train_sft
    from rose_ray.recipes.warmup import weights_digest
    from rose_ray.rows import write_jsonl

    cfg = load_config(None, [f"tiny_dir={tmp_path}"])
    rows = shipped_gold(warmup_cache(cfg, "t")[0])[:8]
    write_jsonl(tmp_path / "gold.jsonl", rows)
    w = cfg.teacher_warmup
    digests = []
    for run in ("a", "b"):
        train_sft(tmp_path / "gold.jsonl", tiny_models["teacher"], tmp_path / run, epochs=1, batch_size=4,
                  lr=w.lr, schedule=w.schedule, seed=w.seed, sft_owners=["teacher"], threads=w.threads,
                  log=lambda line: None)
        digests.append(weights_digest(tmp_path / run))
    assert digests[0] == digests[1]
    assert digests[0] != weights_digest(Path(tiny_models["teacher"]))  # it trained


@pytest.mark.slow
def test_teacher_demonstrations_open_with_the_students_own_sampled_turns(tiny_models, ray_cluster):
    """Live: the (untrained, random) tiny student plays its first turns on the drawn games, and
    the teacher's demonstrations there open with exactly those replies, student-owned, then gold."""
    from rose_ray.recipes.warmup import gold_games, opening_turns, play_gold, student_openings

    cfg = load_config(None, ["teacher_warmup.student_openings=1.0", "teacher_warmup.opening_turns=2",
                             "teacher_warmup.gold_games=4", "rollout.student_sampling.max_new_tokens=12",
                             "teacher_warmup.max_turns=3"])
    games = gold_games(cfg)
    openings = student_openings(cfg, games, str(tiny_models["student"]))
    assert set(openings) == {g.item_id for g in games}  # share 1.0: every game
    assert all(len(openings[g.item_id]) == opening_turns(g, 1.0, 2) for g in games)
    assert len({r for replies in openings.values() for r in replies}) > 1  # sampled text, not a fixed detour
    rows = play_gold(cfg, "teacher", str(tiny_models["student"]))
    assert len(rows) == len(games)
    kept = 0
    for row in rows:
        owners = [m["owner"] for m in row["conversations"][3::2]]
        n = owners.count("student")
        assert owners == ["student"] * n + ["teacher"] * (len(owners) - n) and owners[-1] == "teacher"
        kept += n > 0
    assert kept  # the random student's replies change nothing in most games: kept before the gold path
