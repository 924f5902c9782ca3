"""DiscoveryWorld as a second world, against the real `discoveryworld` package: catalogue,
seeding, text actions, the fast paths, pool hosting, and eval through the same harness."""

from __future__ import annotations

import pytest

from rose_ray.envs.discoveryworld.catalogue import PAIRS, DiscoveryWorldCatalogue
from rose_ray.envs.discoveryworld.protocol import parse_command

CATALOGUE = DiscoveryWorldCatalogue()


def test_catalogue_lists_35_pairs_by_10_seeds_and_tests_on_the_benchmarks_instances():
    from discoveryworld.ScenarioMaker import SCENARIO_INFOS

    package_pairs = [(name, d) for name, info in SCENARIO_INFOS.items() for d in info["difficulty"]]
    assert list(PAIRS) == package_pairs and len(PAIRS) == 35
    assert len(CATALOGUE) == 350 and len(CATALOGUE.task_names()) == 35
    assert {g.variation for g in CATALOGUE.games} == set(range(10))
    # test = the benchmark: seeds 0-4 of the paper's 24 theme pairs and 10 unit tests;
    # training never sees a benchmark instance.
    test = CATALOGUE.split("test")
    assert len(test) == 170 and {g.variation for g in test} == {0, 1, 2, 3, 4}
    assert {CATALOGUE.scenario(g).kind for g in test} == {"theme", "unit test"}
    assert {g.variation for g in CATALOGUE.split("dev")} == {9} and len(CATALOGUE.split("dev")) == 35
    train = CATALOGUE.split("train")
    assert len(train) == 34 * 4 + 9 and not set(train) & set(test)
    assert all(g.variation >= 5 for g in train if CATALOGUE.scenario(g).kind != "tutorial")
    counts = CATALOGUE.task_counts()
    assert counts["tutorial-normal"] == {"all": 10, "train": 9, "dev": 1, "test": 0}
    assert all(c == {"all": 10, "train": 4, "dev": 1, "test": 5} for t, c in counts.items() if t != "tutorial-normal")
    g = CATALOGUE.game("discoveryworld_13")
    assert CATALOGUE.scenario(g).name == "Combinatorial Chemistry" and CATALOGUE.scenario(g).seed == 3
    assert g.world == "discoveryworld" and CATALOGUE.game(13) == g
    assert CATALOGUE.game("discoveryworld_10") == CATALOGUE.find("combinatorial-chemistry-easy", 0)
    with pytest.raises(ValueError, match="is a sciworld game, not discoveryworld; pass --world sciworld"):
        CATALOGUE.game("sciworld_7")
    with pytest.raises(ValueError, match="not an item id"):
        CATALOGUE.game("jar_7")
    with pytest.raises(KeyError, match="outside"):
        CATALOGUE.game("discoveryworld_350")


def test_parse_command_on_a_hand_made_view():
    ui = {"inventoryObjects": [{"uuid": 5, "name": "jar", "description": "empty jar"}],
          "accessibleEnvironmentObjects": [{"uuid": 7, "name": "table", "description": "table"},
                                           {"uuid": 8, "name": "table", "description": "table"},
                                           {"uuid": 9, "name": "key", "description": "rusted key"}],
          "nearbyObjects": {"objects": {"north": [{"uuid": 11, "name": "door", "distance": 2}]}},
          "dialog_box": {"is_in_dialog": False}}
    assert parse_command("put jar on table #8", ui, []) == {"action": "PUT", "arg1": 5, "arg2": 8}
    assert parse_command("USE jar #5 ON rusted key", ui, []) == {"action": "USE", "arg1": 5, "arg2": 9}
    assert parse_command("PICKUP key", ui, []) == {"action": "PICKUP", "arg1": 9}
    assert parse_command("teleport to door", ui, []) == {"action": "TELEPORT_TO_OBJECT", "arg1": 11}
    assert parse_command("teleport to Shed", ui, ["shed"]) == {"action": "TELEPORT_TO_LOCATION",
                                                               "arg1": "shed"}
    assert parse_command("move_direction n", ui, []) == {"action": "MOVE_DIRECTION", "arg1": "north"}
    assert "could mean table #7, table #8" in parse_command("open table", ui, [])
    assert parse_command("pick up door", ui, []).startswith("Invalid action: no 'door'")
    ui["dialog_box"] = {"is_in_dialog": True, "dialogOptions": {1: "hi"}}
    assert parse_command("2", ui, []) == {"chosen_dialog_option_int": 2}
    assert parse_command("choose 1", ui, []) == {"chosen_dialog_option_int": 1}
    # Digits int() refuses ('²' passes str.isdigit()) are an invalid action, not an exception.
    assert parse_command("²", ui, []).startswith("Invalid action")
    assert parse_command("choose ²", ui, []).startswith("Invalid action")


