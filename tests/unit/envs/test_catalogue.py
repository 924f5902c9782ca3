"""ScienceWorld's catalogue: counts, mappings, splits, id lists and the held-out sampler (no
JVM needed), plus one check of the shipped data against a live JVM."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from rose_ray.envs.catalogue import parse_item
from rose_ray.envs.sciworld.catalogue import SciWorldCatalogue, all_tasks


def test_counts_match_the_agentgym_protocol():
    assert sum(t.num_variations for t in all_tasks()) == 7207
    assert len(all_tasks()) == 30
    assert len(SciWorldCatalogue("agentgym")) == 4639
    assert len(SciWorldCatalogue("agentgym_traj")) == 4339


def test_split_sizes_under_agentgym():
    c = SciWorldCatalogue("agentgym")
    sizes = {s: len(c.split(s)) for s in ("train", "dev", "test")}
    assert sizes == {"train": 2312, "dev": 1156, "test": 1171}
    assert sum(sizes.values()) == len(c)
    # The splits partition the games.
    ids = [g.item_id for s in ("train", "dev", "test") for g in c.split(s)]
    assert len(set(ids)) == len(c)


def test_mapping_spot_checks():
    ag, traj = SciWorldCatalogue("agentgym"), SciWorldCatalogue("agentgym_traj")
    first = ag.game("sciworld_0")
    assert (first.task, first.variation) == ("boil", 0)
    assert ag.game(0) == ag.game("0") == first
    # Boil, melt, freeze and change-state have 30 variations each; thermometer starts at 120.
    assert ag.find("melt", 0).item_id == "sciworld_30"
    assert ag.find("use-thermometer", 0).item_id == "sciworld_120"
    assert ag.find("measure-melting-point-unknown-substance", 0).item_id == "sciworld_1096"
    assert traj.find("power-component", 0).item_id == "sciworld_1096"
    assert ag.find("power-component", 0).item_id == "sciworld_1396"
    assert ag.game(4638).task == "identify-life-stages-2"
    excluded = {"grow-plant", "grow-fruit", "mendelian-genetics-known-plant"}
    assert not excluded & {t.task for t in ag.tasks}
    assert "measure-melting-point-unknown-substance" not in {t.task for t in traj.tasks}


def test_first_id_of_every_task_under_both_mappings():
    ag, traj = SciWorldCatalogue("agentgym"), SciWorldCatalogue("agentgym_traj")
    assert len(ag.tasks) == 23 and len(traj.tasks) == 22
    running = 0
    for t in ag.tasks:  # topic order, contiguous blocks
        assert ag.find(t.task, 0).index == running
        assert ag.find(t.task, t.num_variations - 1).index == running + t.num_variations - 1
        running += t.num_variations
    for t in traj.tasks:
        shift = 300 if ag.find(t.task, 0).index >= 1096 else 0  # 2-3 has 300 variations
        assert traj.find(t.task, 0).index == ag.find(t.task, 0).index - shift


def test_id_list_files(tmp_path):
    c = SciWorldCatalogue()
    path = tmp_path / "ids.json"
    path.write_text(json.dumps([3, "sciworld_40", "7"]))
    assert [g.index for g in c.split(str(path))] == [3, 40, 7]
    path.write_text(json.dumps([1, "sciworld_x", 2]))
    with pytest.raises(ValueError, match=r"entry 1 \('sciworld_x'\)"):
        c.split(str(path))
    path.write_text(json.dumps([1, 999999]))
    with pytest.raises(ValueError, match="entry 1 .*outside"):
        c.split(str(path))
    # AgentGym's own dataset files (AgentTraj-L's sciworld_train.json: rows with an item_id) are id lists too.
    rows = [{"item_id": f"sciworld_{n}", "conversations": [{"from": "human", "value": "..."}]} for n in (5, 9)]
    path.write_text(json.dumps(rows))
    assert [g.index for g in c.split(str(path))] == [5, 9]
    path.write_text(json.dumps([*rows, {"conversations": []}]))
    with pytest.raises(ValueError, match="entry 2 is an object without an 'item_id'"):
        c.split(str(path))
    path.write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        c.split(str(path))
    with pytest.raises(ValueError, match="unknown split 'nope'"):
        c.split("nope")
    with pytest.raises(ValueError):
        parse_item(True)


def test_shipped_agenteval_list_is_held_out_under_traj_mapping():
    traj = SciWorldCatalogue("agentgym_traj")
    games = traj.split("agenteval_test")
    assert len(games) == 200
    assert {traj.split_of(g) for g in games} == {"test"}
    with pytest.raises(ValueError, match="agentgym_traj"):
        SciWorldCatalogue("agentgym").split("agenteval_test")


def test_stratified_sampler_is_seeded_and_balanced_over_tasks():
    c = SciWorldCatalogue()
    test = c.split("test")
    a, b = c.sample("test", 200, seed=3), c.sample("test", 200, seed=3)
    assert a == b and len(a) == 200 and len(set(a)) == 200
    assert set(a) <= set(test)
    assert c.sample("test", 200, seed=4) != a
    assert [g.index for g in a] == sorted(g.index for g in a)
    counts = Counter(g.task for g in a)
    total = Counter(g.task for g in test)
    assert set(counts) == set(total)  # every task represented
    # Balanced: a task gives all its games, or as many as any other task gives (or one less).
    most = max(counts.values())
    for task, n in total.items():
        assert counts[task] == n or counts[task] >= most - 1, (task, counts[task], n)
    assert any(counts[t] < total[t] for t in total) and min(total.values()) < most  # both cases occur
    assert c.sample("test", 5000, seed=0) == test


def test_the_sampler_keeps_only_the_tasks_asked_for():
    c = SciWorldCatalogue()
    test = c.split("test")
    assert c.sample("test", None) == test == c.sample("test", None, tasks=[])  # n=None: all, in split order
    boil = [g for g in test if g.task == "boil"]
    assert c.sample("test", None, tasks=["boil"]) == boil
    two = c.sample("test", 6, seed=1, tasks=["boil", "melt"])
    assert len(two) == 6 and Counter(g.task for g in two) == {"boil": 3, "melt": 3}
    assert [g.index for g in two] == sorted(g.index for g in two)
    assert c.sample("test", 6, seed=1, tasks=["melt", "boil"]) == two
    assert c.sample("test", 10**6, tasks=["boil"]) == boil
    with pytest.raises(ValueError) as e:
        c.sample("test", 5, tasks=["boil", "fly", "grow-plant"])  # grow-plant: not under agentgym
    assert str(e.value) == ("tasks: unknown task(s) ['fly', 'grow-plant'] in sciworld (mapping 'agentgym'); "
                            "`rose-ray games --world sciworld` lists them")


