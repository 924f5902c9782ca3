"""The small tier (configs/small.yaml): gold paths that look before they choose, a warmed base
student, `rose-ray warmup`, and the table's bootstrap intervals (bench/table.py)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from rose_ray.cli import main
from rose_ray.config import ConfigError, load_config
from rose_ray.envs.sciworld.gold import look_before_focus, visible_names

ROOT = Path(__file__).resolve().parents[3]
SMALL = str(ROOT / "configs" / "small.yaml")


def test_look_before_focus_after_a_move_only():
    moved = ["open door to outside", "go to outside", "focus on crocodile", "wait1"]
    assert look_before_focus(moved) == ["open door to outside", "go to outside", "look around",
                                        "focus on crocodile", "wait1"]
    looked = ["go to workshop", "look around", "focus on orange wire", "move orange wire to orange box"]
    assert look_before_focus(looked) == looked  # ScienceWorld's find paths already look
    here = ["focus on egg parrot", "focus on baby baby mouse", "wait1"]  # starts where the animals are
    assert look_before_focus(here) == here
    # a second focus right after the first needs no second look
    assert look_before_focus(["go to outside", "focus on a", "focus on b"]) == [
        "go to outside", "look around", "focus on a", "focus on b"]


def test_visible_names_follow_what_the_game_said():
    actions = ["look around", "focus on cloth sittable", "move cloth sittable to blue box"]
    observations = ["This room is called the bedroom. ... a mattress ...", "You focus on the mattress.",
                    "You move the mattress to the blue box."]
    assert visible_names(actions, observations) == ["look around", "focus on mattress", "move mattress to blue box"]
    # the same name, or an observation of another shape: unchanged
    assert visible_names(["focus on drawing"], ["You focus on the drawing."]) == ["focus on drawing"]
    assert visible_names(["focus on x"], ["No known action matches that input."]) == ["focus on x"]
    with pytest.raises(ValueError):
        visible_names(["a", "b"], ["only one"])


def test_student_openings_drawn_per_game_and_keyed_by_the_student():
    from rose_ray.provision.warmup import opening_turns, warmup_cache
    from rose_ray.types import GameId

    games = [GameId("find-animal", i, f"sciworld_{i}") for i in range(200)]
    drawn = [opening_turns(g, 0.5, 2) for g in games]
    assert drawn == [opening_turns(g, 0.5, 2) for g in games] and set(drawn) == {0, 1, 2}
    assert 60 < sum(map(bool, drawn)) < 140 and all(opening_turns(g, 0.0, 2) == 0 for g in games)
    plain = warmup_cache(load_config(SMALL, ["teacher_warmup.student_openings=0"]), "t")[1]
    run_t = ["teacher_warmup.student_openings=0.5", "teacher_warmup.opening_temperature=null"]  # the run's T
    on = load_config(SMALL, run_t)
    a = warmup_cache(on, "t", "teacher")[1]
    b = warmup_cache(load_config(SMALL, [*run_t, "student_warmup.epochs=4"]), "t", "teacher")[1]
    hot = warmup_cache(load_config(SMALL, [*run_t, "rollout.student_sampling.temperature=0.5"]), "t", "teacher")[1]
    assert len({plain, a, b, hot}) == 4  # another student or its sampling: another teacher
    # The student is named by what it is built from, not by where: the same key in another cache.
    assert warmup_cache(load_config(SMALL, [*run_t, "tiny_dir=/elsewhere"]), "t", "teacher")[0] == \
        warmup_cache(on, "t", "teacher")[0]
    fixed = ["teacher_warmup.student_openings=0.5", "teacher_warmup.opening_temperature=1.0"]
    at = [warmup_cache(load_config(SMALL, [*fixed, f"rollout.student_sampling.temperature={t}"]), "t", "teacher")[1]
          for t in (0.3, 1.0)]
    assert at[0] == at[1] == a  # openings at their own temperature: the run's may change (chosen on dev)
    with pytest.raises(ConfigError, match="student_warmup.student_openings"):
        load_config(SMALL, ["student_warmup.student_openings=0.5"])
    with pytest.raises(ConfigError, match="teacher_warmup.student_openings"):
        load_config(SMALL, ["teacher_warmup.student_openings=2"])


def test_detours_are_harmless_replies_drawn_from_the_game():
    from rose_ray.envs.protocol import parse_action
    from rose_ray.envs.sciworld.gold import DETOURS
    from rose_ray.provision.gold import detour_replies
    from rose_ray.types import GameId

    games = [GameId("find-animal", i, f"sciworld_{i}") for i in range(200)]
    assert all(detour_replies(g, 0.0, DETOURS) == [] for g in games)
    drawn = [detour_replies(g, 0.5, DETOURS) for g in games]
    assert drawn == [detour_replies(g, 0.5, DETOURS) for g in games]  # the same every time
    assert 60 < sum(bool(d) for d in drawn) < 140 and {len(d) for d in drawn} == {0, 1, 2}
    cut = acted = 0
    for reply in (r for d in drawn for r in d):
        assert reply.startswith("Thought: ")
        if "\nAction: " in reply:
            acted += 1
            assert parse_action(reply).action in DETOURS
        else:
            cut += 1
    assert cut and acted


def test_warm_up_errors_name_their_section():
    with pytest.raises(ConfigError, match="student_warmup.epochs"):
        load_config(SMALL, ["student_warmup.epochs=0"])
    with pytest.raises(ConfigError, match="teacher_warmup.schedule"):
        load_config(SMALL, ["teacher_warmup.schedule=cyclic"])
    assert main(["warmup", "--config", SMALL, "student_warmup.lr=0"]) == 2


def test_the_small_tier_leaves_room_for_whole_games():
    """Turn limits above the tier's gold lengths (find-non-living-thing up to 7 actions, lifespan
    up to 9, each plus one look), the teacher warmed on whole paths, 48 held-out games."""
    cfg = load_config(SMALL)
    assert cfg.eval.n >= 48 and cfg.eval.split == "test" and cfg.rollout.split == "train"
    assert min(cfg.eval.max_turns, cfg.rollout.max_turns, cfg.teacher_warmup.max_turns) >= 10 + 2
    assert cfg.teacher_warmup.observe and cfg.student_warmup.enabled
    assert cfg.student_warmup.max_turns < cfg.teacher_warmup.max_turns  # the base student sees openings only


def test_bootstrap_intervals(bench_table):
    table = bench_table
    rng = np.random.default_rng(0)
    wins = (rng.random((3, 48)) < 0.3).astype(float)
    mean, low, high = table.bootstrap_mean(wins)
    assert low < mean < high and mean == pytest.approx(wins.mean())
    assert 0.1 < high - low < 0.4  # about ±2 standard errors of 144 coin flips at p=0.3
    assert table.bootstrap_mean(np.full((3, 48), 0.25))[1:] == (0.25, 0.25)  # no spread, no width
    # more games, a narrower interval
    many = (rng.random((3, 480)) < 0.3).astype(float)
    _, lo2, hi2 = table.bootstrap_mean(many)
    assert hi2 - lo2 < (high - low) / 2
    # an arm against itself differs by 0, inside its interval; against a better arm, below 0
    d, dlo, dhi = table.bootstrap_difference(wins, wins)
    assert d == 0 and dlo <= 0 <= dhi
    better = np.clip(wins + (rng.random((3, 48)) < 0.5), 0, 1)
    d, dlo, dhi = table.bootstrap_difference(wins, better)
    assert d < 0 and dhi < 0
    with pytest.raises(ValueError, match="48 games against 47"):
        table.bootstrap_difference(wins, wins[:, :47])


def test_table_rows_use_every_game_of_every_seed(bench_table):
    table = bench_table

    def run(scores):
        games = [{"item_id": f"sciworld_{i}", "task": "t", "score": s, "success": float(s == 1), "pass": float(s > 0)}
                 for i, s in enumerate(scores)]
        return {"games": games[::-1], "after": {"score": float(np.mean(scores)), "success": 0.0, "pass": 0.0},
                "wall_s": 1.0, "trained_tokens": 10.0}

    runs = {"sft": [run([0, 0.5, 1, 0]), run([0, 0.5, 0, 0])], "rose_fixed": [run([1, 1, 1, 0]), run([1, 1, 0, 0])]}
    rows = table.table_rows(runs)
    assert [r["arm"] for r in rows] == ["sft", "rose_fixed"]
    assert rows[0]["score"] == pytest.approx(2 / 8) and rows[0]["seeds"] == 2 and rows[0]["games"] == 4
    assert rows[1]["success"] == pytest.approx(5 / 8)
    diff = table.difference_rows(runs)[0]
    assert diff["arm"] == "rose_fixed - sft" and diff["score"] == pytest.approx(5 / 8 - 2 / 8)
    assert "| rose_fixed - sft |" in table.markdown(rows, [diff])
    # With the base student: the positive control (SFT - student) first, then each arm against it.
    runs["student"] = [run([0, 0, 0.5, 0])]
    diffs = {d["arm"]: d for d in table.difference_rows(runs)}
    assert list(diffs) == ["sft - student", "rose_fixed - sft", "rose_fixed - student"]
    assert diffs["sft - student"]["score"] == pytest.approx(2 / 8 - 1 / 8)
    assert diffs["rose_fixed - student"]["score"] == pytest.approx(5 / 8 - 1 / 8)
    del runs["student"]
    runs["sft"][1]["games"] = runs["sft"][1]["games"][:3]
    with pytest.raises(ValueError, match="different numbers of games"):
        table.table_rows(runs)


def test_the_small_tier_warms_on_its_shipped_demonstrations():
    """Both warm-ups of the tier train on shipped rows (gold paths played live differ between
    ScienceWorld loads, so a live build would be another tier on every machine): the games the
    settings draw, each row within its turns, the teacher's opening with 1-2 student-owned replies
    (the base student's own, or a detour) where drawn; another base student plays gold now."""
    from rose_ray.envs.sciworld.catalogue import SciWorldCatalogue
    from rose_ray.provision.warmup import gold_games, shipped_gold, warmup_cache

    cfg = load_config(SMALL)
    catalogue = SciWorldCatalogue(cfg.env.mapping)
    opening = cfg.env.protocol().opening()
    for role in ("student", "teacher"):
        w = getattr(cfg, f"{role}_warmup")
        rows = shipped_gold(warmup_cache(cfg, "", role)[0])
        assert rows is not None, role
        assert sorted(r["item_id"] for r in rows) == sorted(g.item_id for g in gold_games(cfg, role))
        assert {catalogue.split_of(catalogue.game(r["item_id"])) for r in rows} == {"train"}
        for r in rows:
            assert [(m["role"], m["content"]) for m in r["conversations"][:2]] == opening
            assert 1 <= r["rounds"] <= w.max_turns
        owners = [[m["owner"] for m in r["conversations"][3::2]] for r in rows]
        opened = [o.count("student") for o in owners]
        if role == "student":
            assert not any(opened)
        else:
            # half open with the student's own replies, half of the rest with a harmless detour
            expected = w.student_openings + (1 - w.student_openings) * w.detours
            assert set(opened) == {0, 1, 2} and abs(sum(map(bool, opened)) / len(rows) - expected) < 0.12
            assert all(o == ["student"] * n + ["teacher"] * (len(o) - n) for o, n in zip(owners, opened))
    # Another student (its warm-up's settings) opens otherwise: its teacher's rows are played now.
    assert shipped_gold(warmup_cache(load_config(SMALL, ["student_warmup.lr=1e-3"]), "", "teacher")[0]) is None
    assert shipped_gold(warmup_cache(load_config(SMALL, ["student_warmup.lr=1e-3"]), "", "student")[0]) is not None
