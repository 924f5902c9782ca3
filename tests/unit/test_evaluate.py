"""Held-out evaluation: metrics, a real eval of the tiny student, resume, compare."""

from __future__ import annotations

import json

import pytest

from rose_ray.envs.sciworld.protocol import is_success, normalise_score
from rose_ray.evaluate import EvalCommand, compare, game_record, summarise
from rose_ray.types import GameId, Trajectory


def record(task: str, raw: int, turns: int = 5, invalid: int = 0, **extra) -> dict:
    """A ScienceWorld game's record, scored as SciWorldGame scores its steps."""
    game = GameId(task, 0, f"sciworld_{abs(hash((task, raw, turns))) % 4000}")
    t = Trajectory(game=game, turns=[], score=normalise_score(raw), raw_score=raw, success=is_success(raw),
                   rounds=turns, invalid_actions=invalid)
    return {**game_record(t), **extra}


def test_metrics_on_hand_made_trajectories():
    recs = [record("boil", -100), record("boil", 0), record("melt", 50, invalid=5), record("melt", 100),
            record("melt", 99)]
    s = summarise(recs)
    o = s["overall"]
    assert o["games"] == 5
    assert o["score"] == pytest.approx((0 + 0 + 0.5 + 1.0 + 0.99) / 5)  # -100 scores 0
    assert o["success"] == pytest.approx(1 / 5)  # only 100 succeeds, not 99
    assert o["pass"] == pytest.approx(3 / 5)  # > 0 passes; -100 and 0 do not
    assert o["invalid_action_rate"] == pytest.approx(5 / 25)
    assert s["per_task"]["boil"]["score"] == 0.0 and s["per_task"]["melt"]["games"] == 3


def test_success_is_the_worlds_not_a_score_threshold():
    # DiscoveryWorld: success is `completedSuccessfully`, whatever the sub-goal score.
    game = GameId("tutorial-normal", 0, "discoveryworld_0", world="discoveryworld")
    done = game_record(Trajectory(game=game, turns=[], score=0.6, raw_score=60, success=True, rounds=3))
    partial = game_record(Trajectory(game=game, turns=[], score=1.0, raw_score=100, success=False, rounds=3))
    o = summarise([done, partial])["overall"]
    assert done["success"] and not partial["success"]
    assert o["success"] == 0.5 and o["score"] == pytest.approx(0.8) and o["pass"] == 1.0


def test_compare_prints_results_side_by_side(tmp_path):
    for name, score in (("a", 0.1), ("b", 0.3)):
        summary = summarise([record("boil", int(score * 100))])
        (tmp_path / f"{name}.json").write_text(json.dumps({"config": {"model": f"model-{name}"}, "summary": summary}))
    table = compare([str(tmp_path / "a.json"), str(tmp_path / "b.json")])
    assert "model-a" in table and "model-b" in table and "0.3000" in table
    (tmp_path / "bad.json").write_text("{}")
    with pytest.raises(ValueError, match="not an eval result"):
        compare([str(tmp_path / "bad.json")])


def test_eval_arguments_are_checked(tmp_path, monkeypatch, capsys):
    import ray

    from rose_ray.cli import main

    assert main(["eval", "--model", "x", "--handoff", "2"]) == 2
    assert main(["eval", "--model", "x", "--max-turns", "0"]) == 2
    # A model that is not here is named before anything starts: no Ray, no runs/eval/ folder.
    monkeypatch.chdir(tmp_path)
    ray_before = ray.is_initialized()
    assert main(["eval", "--model", "/nonexistent/model", "--n", "1"]) == 2
    assert "model '/nonexistent/model' is not available" in capsys.readouterr().err
    assert ray.is_initialized() == ray_before
    assert list(tmp_path.iterdir()) == []


def test_eval_takes_a_runs_tasks_and_picks_its_eval_games(tmp_path, capsys):
    """`rose-ray eval --tasks T --n N --seed S` plays the games a training run with `tasks: T`,
    `eval.n: N`, `eval.seed: S` evaluates on (both are the catalogue's sample); a bad task is named."""
    from rose_ray.cli import main
    from rose_ray.config import load_config
    from rose_ray.envs.worlds import get_world
    from rose_ray.evaluate import resume_header

    cfg = load_config(None)
    job = EvalCommand(model="m", n=cfg.eval.n, seed=cfg.eval.seed, tasks=",".join(cfg.tasks))
    assert resume_header(job)["tasks"] == list(cfg.tasks)  # a partial file of other tasks is not resumed
    catalogue = get_world(cfg.env.world).catalogue(cfg.env.mapping)
    games = catalogue.sample(job.split, job.n, job.seed, tasks=job.task_names)
    assert len(games) == cfg.eval.n and {g.task for g in games} == set(cfg.tasks)
    assert main(["eval", "--model", str(tmp_path), "--tasks", "find-plant,boil-everything",
                 "--out", str(tmp_path / "e")]) == 2
    assert "tasks: unknown task(s) ['boil-everything']" in capsys.readouterr().err


def test_a_bad_line_mid_partial_file_costs_only_its_game(tmp_path, capsys):
    """An eval's partial results with a line that cannot be read in the middle (a disk error,
    an edit): the finished games around it are kept, the line is named and its game is played
    again (before, the whole file was refused: "delete the file", every finished game lost).
    A file of other settings, or whose header cannot be read, is refused and left as it is."""
    from rose_ray.errors import InputError
    from rose_ray.evaluate import PartialGames

    want = {"model": "m", "seed": 0}
    games = [record("boil", 50), record("melt", 100), record("freeze", 0)]
    path = tmp_path / "ev.partial.jsonl"
    lines = [json.dumps({"eval_config": want}), json.dumps(games[0]), '{"item_id": "sciworld_9", "sco',
             json.dumps({"item_id": "sciworld_8"}), "\xff", json.dumps(games[1]), "[]", json.dumps(games[2])]
    path.write_bytes("\n".join(lines).encode("utf-8", "surrogateescape").replace("\xff".encode(), b"\xff") + b"\n")
    before = path.read_bytes()
    done = PartialGames(tmp_path / "ev", want).done
    assert list(done) == [g["item_id"] for g in games]
    err = capsys.readouterr().err
    for n, problem in ((3, "not valid JSON"), (4, "not a finished game (task, score, success, pass, turns"),
                       (5, "not UTF-8 text"), (7, "expected a JSON object, got list")):
        assert f"{path}:{n}: {problem}" in err
    assert "Traceback" not in err and path.read_bytes() == before
    with pytest.raises(InputError, match="partial results of an eval with other settings"):
        PartialGames(tmp_path / "ev", {**want, "seed": 1})
    path.write_bytes(b"\xff\n" + before.split(b"\n", 1)[1])
    with pytest.raises(InputError, match=f"{path}:1: not UTF-8 text.*header of the partial results cannot be read"):
        PartialGames(tmp_path / "ev", want)
