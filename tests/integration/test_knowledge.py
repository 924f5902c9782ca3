"""The half of tests/unit/envs/test_knowledge.py whose tests start processes
(Ray, JVMs, servers or commands); that file's docstring says what both halves check."""

from __future__ import annotations

from tests.unit.envs.test_knowledge import CATALOGUE, CHEMISTRY


def test_a_game_carries_its_critical_questions_and_done_ends_it():
    from rose_ray.envs.discoveryworld.game import DiscoveryWorldGame

    with DiscoveryWorldGame() as g:
        unit = g.load(CATALOGUE.find("small-skills-doors-test-normal", 1))
        assert g.limit == 100 and unit.info["scoring"]["critical_questions"] == []
        first = g.load(CHEMISTRY)
        scoring = first.info["scoring"]
        assert g.limit == 100 and scoring["critical_questions"]
        assert all(q.startswith("Does it clearly state") for q in scoring["critical_questions"])
        assert scoring["task_description"] and scoring["task_description"] in first.observation
        assert 0.0 <= scoring["process"] <= 1.0
        assert "Does it clearly state" not in first.observation  # oracle knowledge stays hidden
        r = g.step("done now")
        assert r.observation.startswith("Invalid action") and not r.done
        r = g.step("done")
        assert r.done and r.end_reason == "agent_stop" and r.info["scoring"]["process"] == scoring["process"]
