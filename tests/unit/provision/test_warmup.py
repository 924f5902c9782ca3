"""The tiny default's teacher warm-up: shipped gold demonstrations, held-out games kept out."""

from __future__ import annotations

import json

from rose_ray.config import load_config
from rose_ray.envs.sciworld.catalogue import SciWorldCatalogue
from rose_ray.provision.warmup import shipped_gold, warmup_cache


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
