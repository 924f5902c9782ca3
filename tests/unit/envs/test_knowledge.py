"""DiscoveryWorld scored as its paper scores it: the agent's thoughts (or its report, asked after
the last observation) judged one critical question at a time with a JSON answer (parse, cache, a
`rose-ray serve` judge over HTTP and a local-folder judge), the tables in the shape of the
paper's Tables 4 and 5, and the paper's step limits.

The judges here are tiny untrained models: their verdicts are noise. The tests check the
mechanics (every question asked once and recorded, answers parsed or counted as unparsed,
the cache, the tables), never what a verdict says."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from rose_ray.envs.discoveryworld.catalogue import DiscoveryWorldCatalogue
from rose_ray.envs.discoveryworld.knowledge import episode_thoughts, judge_messages
from rose_ray.envs.worlds import get_world
from rose_ray.errors import InputError
from rose_ray.judge import (
    JudgeConfig,
    Verdict,
    VerdictCache,
    fit_knowledge,
)

CATALOGUE = DiscoveryWorldCatalogue()


SCORER = get_world("discoveryworld").knowledge  # the paper's knowledge scorer


CHEMISTRY = CATALOGUE.find("combinatorial-chemistry-easy", 0)


NAME = "tiny-judge"


# --------------------------------------------------------------------------- parsing and cache
ANSWER = '{"criticalQuestion": "Q?", "evaluation": %s, "explanation": "it names the compound"}'


@pytest.mark.parametrize("answer, verdict, parsed", [
    (ANSWER % 1, 1, True),
    (ANSWER % 0, 0, True),
    ("```json\n" + ANSWER % 1 + "\n```", 1, True),  # a local judge without JSON mode fences it
    ("Here is my answer: " + ANSWER % 1, 1, True),
    ("<think>evaluation 0 at first</think>" + ANSWER % 1, 1, True),
    (ANSWER % '"1"', 0, False),  # a string: the paper's scorer does not count it either
    (ANSWER % "true", 0, False),
    (ANSWER % 2, 0, False),
    (ANSWER % 0.5, 0, False),
    ('{"criticalQuestion": "Q?", "explanation": "no key"}', 0, False),
    ("Reason: it does.\nVerdict: 1", 0, False),  # the old two-line answer is no JSON
    ('[{"evaluation": 1}]', 0, False),
    ("", 0, False),
    ('<think>{"evaluation": 1}, I think, but', 0, False),  # cut while thinking: nothing is an answer
])
def test_verdicts_are_the_json_evaluation_and_malformed_ones_count_zero(answer, verdict, parsed):
    v = Verdict("Q?", *SCORER.read_verdict(answer))
    assert (v.verdict, v.parsed, v.question) == (verdict, parsed, "Q?")
    if parsed:
        assert v.explanation == "it names the compound"


def test_the_judge_reads_the_agents_thoughts_as_the_papers_scorer_does():
    replies = ["Thought: the jar looks useful.\nAction: pick up jar", "<think>hm</think>Action: move north",
               "Thought: mixing A and C removed the rust!\nAction: done", "no format at all"]
    assert episode_thoughts(replies) == ("Thought 1: the jar looks useful.\n"
                                         "Thought 2: mixing A and C removed the rust!\nThought 3: no format at all\n")
    [message] = judge_messages("Find the rust remover.", "Thought 1: A and C.\n", "Does it clearly state A?")
    text = message["content"]
    for part in ("Find the rust remover.", "Thought 1: A and C.", "Does it clearly state A?",
                 '"criticalQuestion"', '"evaluation"', '"explanation"', "JSON"):
        assert part in text
    # The paper's settings: greedy, 800 new tokens, thoughts by default.
    from rose_ray.evaluate import EvalCommand

    cfg = JudgeConfig(world="discoveryworld", model="m")
    assert (cfg.sampling().temperature, cfg.sampling().max_new_tokens) == (0.0, 800)
    job = EvalCommand(model="m", world="discoveryworld")
    assert job.knowledge_from == "thoughts" and job.judge_max_new_tokens == 800
    # Too long for the judge: the oldest thoughts go, the latest stay, and it says so.
    kept, cut = fit_knowledge("Thought 1: old\n" + "x" * 50 + "Thought 9: new\n", 30)
    assert cut and kept.endswith("Thought 9: new\n") and "earlier characters cut" in kept
    assert fit_knowledge("short", 30) == ("short", False)
    assert JudgeConfig(world="discoveryworld", model="m", context_tokens=4096).knowledge_chars == 3 * (4096 - 800 - 1024)


def test_the_judge_asks_and_reads_through_its_worlds_scorer():
    """The prompt and the reading of answers are the world's (World.knowledge); the judge has none
    of its own, and a world without critical questions has no scorer to judge with."""
    import rose_ray.judge as judge

    assert not hasattr(judge, "JUDGE_PROMPT") and not hasattr(judge, "judge_messages")
    cfg = JudgeConfig(world="discoveryworld", model="m")
    assert cfg.scorer is SCORER and cfg.cache_name.endswith(f"prompt={SCORER.PROMPT_HASH}")
    with pytest.raises(InputError, match="world 'sciworld' has no critical questions"):
        _ = JudgeConfig(world="sciworld", model="m").cache_name


def test_the_cache_keys_on_judge_question_and_knowledge(tmp_path, capsys):
    path = tmp_path / "v.jsonl"
    cache = VerdictCache(path)
    cache.put("judge-a", "I found that X rusts.", Verdict("Q1?", *SCORER.read_verdict(ANSWER % 1)), "raw")
    cache.put("judge-a", "I found that X rusts.", Verdict("Q2?", *SCORER.read_verdict("gibberish")), "gibberish")
    with path.open("a") as f:
        f.write('{"judge": "judge-a", "key": "cut sho')  # a write cut short by a kill
    again = VerdictCache(path)
    hit = again.get("judge-a", "Q1?", "I found that X rusts.")
    assert hit is not None and hit.verdict == 1 and hit.parsed and hit.cached
    miss = again.get("judge-a", "Q2?", "I found that X rusts.")
    assert miss is not None and miss.verdict == 0 and not miss.parsed  # unparsed answers are kept too
    assert again.get("judge-b", "Q1?", "I found that X rusts.") is None  # another judge asks again
    assert again.get("judge-a", "Q1?", "I found nothing.") is None  # other knowledge asks again
    # What is put after a cut line starts on a line of its own (before, it was glued to the cut
    # one and lost); a line that cannot be read is named and skipped.
    again.put("judge-b", "I found that X rusts.", Verdict("Q1?", *SCORER.read_verdict(ANSWER % 1)), "raw")
    with path.open("ab") as f:
        f.write(b'{"judge": "\xff"}\n[1]\n')
    third = VerdictCache(path)
    assert third.get("judge-b", "Q1?", "I found that X rusts.") is not None and len(third.entries) == 3
    err = capsys.readouterr().err
    assert f"{path}:4: not UTF-8 text" in err and f"{path}:5: expected a JSON object, got list" in err
    # What changes a judge's greedy answers changes its cache name: the budget, thinking.
    base = JudgeConfig(world="discoveryworld", model="openai:http://127.0.0.1:1/v1", served_model=NAME)
    names = {base.cache_name, replace(base, max_new_tokens=4096).cache_name, replace(base, thinking=False).cache_name}
    assert len(names) == 3 and all(n.startswith(base.name) for n in names)


# --------------------------------------------------------------------------- tables
def _record(item: str, success: bool, process: float, knowledge: float | None = None, **extra) -> dict:
    g = CATALOGUE.game(item)
    r = {"item_id": item, "task": g.task, "var": g.variation, "score": process, "raw_score": 0,
         "success": success, "pass": process > 0, "turns": 3, "invalid_actions": 0, "process": process, **extra}
    if knowledge is not None:
        r["knowledge"] = knowledge
        r["verdicts"] = [{"question": "Q", "verdict": int(knowledge >= 0.5), "parsed": True, "explanation": ""}]
    return r


def test_the_paper_tables_average_seeds_then_themes(tmp_path):
    from rose_ray.evaluate import compare, markdown, summarise

    chem_easy = [g.item_id for g in CATALOGUE.games if g.task == "combinatorial-chemistry-easy"]
    chem_normal = [g.item_id for g in CATALOGUE.games if g.task == "combinatorial-chemistry-normal"]
    reactor_easy = [g.item_id for g in CATALOGUE.games if g.task == "reactor-lab-easy"]
    doors = [g.item_id for g in CATALOGUE.games if g.task == "small-skills-doors-test-normal"]
    records = [_record(chem_easy[0], True, 1.0, 1.0), _record(chem_easy[1], False, 0.5, 0.0),
               _record(chem_normal[0], False, 0.2, 0.5), _record(reactor_easy[0], False, 0.3, 0.0),
               _record(doors[0], True, 1.0), _record(doors[1], False, 0.0)]
    s = summarise(records)
    paper = s["paper"]
    easy = paper["themes"]["Combinatorial Chemistry"]["Easy"]
    assert easy == {"games": 2, "completion": 0.5, "process": 0.75, "knowledge": 0.5, "knowledge_games": 2}
    assert paper["themes"]["Reactor Lab"]["Easy"]["process"] == pytest.approx(0.3)
    # The Average row averages the themes (0.75 and 0.3), not the three games.
    assert paper["theme_average"]["Easy"]["process"] == pytest.approx((0.75 + 0.3) / 2)
    assert paper["unit_tests"]["Doors Test"] == {"games": 2, "completion": 0.5, "process": 0.5,
                                                 "knowledge": None, "knowledge_games": 0}
    o = s["overall"]
    assert o["completion"] == pytest.approx(2 / 6) and o["knowledge"] == pytest.approx(1.5 / 4)
    assert o["judged_questions"] == 4 and o["unparsed_verdicts"] == 0
    md = markdown(s, "t")
    assert "Easy Knowl." in md and "| Combinatorial Chemistry | 0.50 | 0.75 | 0.50 |" in md
    assert "| Doors Test | 0.50 | 0.50 | 2 |" in md
    # Without a judge there is no knowledge column, and the table says why.
    plain = summarise([{k: v for k, v in r.items() if k not in ("knowledge", "verdicts")} for r in records])
    assert plain["overall"]["knowledge"] is None
    assert "Knowl." not in markdown(plain, "t") and "knowledge needs --judge" in markdown(plain, "t")
    for name, summary in (("judged", s), ("plain", plain)):
        (tmp_path / f"{name}.json").write_text(json.dumps({"config": {"model": name}, "summary": summary}))
    table = compare([str(tmp_path / "judged.json"), str(tmp_path / "plain.json")])
    assert "| Combinatorial Chemistry Easy | 0.50 / 0.75 / 0.50 | 0.50 / 0.75 / – |" in table
    assert "| judged | 6 |" in table and table.splitlines()[0].endswith("Completion | Process | Knowledge |")


# --------------------------------------------------------------------------- step limits, the game side
def test_step_limits_are_the_papers_and_max_turns_overrides():
    from rose_ray.evaluate import EvalCommand

    limits = {g.task: CATALOGUE.turn_limit(g) for g in CATALOGUE.games}
    assert all(v == 100 for t, v in limits.items() if t.endswith("-easy") or t.startswith("small-skills-"))
    assert all(v == 1000 for t, v in limits.items() if t.endswith(("-normal", "-challenge"))
               and not t.startswith("small-skills-"))
    assert sum(t.startswith("small-skills-") for t in limits) == 10 and limits["tutorial-normal"] == 1000
    assert EvalCommand(model="m", world="discoveryworld").max_turns is None  # the world's own limits
    assert EvalCommand(model="m").max_turns == 20  # ScienceWorld's default as before
    assert EvalCommand(model="m", world="discoveryworld", max_turns=7).max_turns == 7


