"""The turn policies (rollout/handoff.py) alone: fixed, curriculum, teacher-only, none and
on_failure give their student turns, decay's takeover probability falls linearly to zero and
its draws are seeded per episode and turn and follow p, and bad settings name their key. The
policies inside an episode: test_episode.py; as the `algorithm` section sets them: test_config.py."""

from __future__ import annotations

import pytest

from rose_ray.rollout.handoff import decay_takes_over, turn_policy


def test_handoff_policies():
    assert turn_policy("fixed", k=5).student_turns(100) == 5
    cur = turn_policy("curriculum", k_start=1, k_max=4, grow_every=10)
    assert [cur.student_turns(s) for s in (0, 9, 10, 25, 1000)] == [1, 1, 2, 3, 4]
    assert turn_policy("teacher_only").student_turns() == 0
    assert turn_policy("none").student_turns() is None
    assert turn_policy("on_failure").student_turns() is None
    with pytest.raises(ValueError, match="handoff.policy"):
        turn_policy("sometimes")
    with pytest.raises(ValueError, match="handoff.k"):
        turn_policy("fixed", k=-1)


def test_decay_probability_falls_linearly_to_zero():
    d = turn_policy("decay", p0=0.6, decay_steps=10)
    assert [d.takeover_p(s) for s in (0, 5, 10, 11, 1000)] == pytest.approx([0.6, 0.3, 0.0, 0.0, 0.0])
    assert d.student_turns(0) is None  # decided turn by turn, not by a fixed K
    assert turn_policy("decay", p0=1.0, decay_steps=1).takeover_p(0) == 1.0
    for bad, key in ((dict(p0=1.5), "algorithm.handoff.p0"), (dict(p0=-0.1), "algorithm.handoff.p0"),
                     (dict(p0=float("nan")), "algorithm.handoff.p0"),
                     (dict(decay_steps=0), "algorithm.handoff.decay_steps")):
        with pytest.raises(ValueError, match=key):
            turn_policy("decay", **bad)


def test_decay_draws_are_seeded_and_follow_p():
    seeds = [f"0/0/{i}/sciworld_{i}" for i in range(4000)]
    # The same seed and turn decide the same, in any order and any process (string seeds).
    first = [decay_takes_over(s, 3, 0.3) for s in seeds]
    assert [decay_takes_over(s, 3, 0.3) for s in reversed(seeds)] == first[::-1]
    # Turns and episodes are independent draws: the takeover frequency is p (4,000 draws:
    # the standard error is <= 0.008, so 0.03 is ~4 sigma).
    for p in (0.0, 0.1, 0.5, 0.9, 1.0):
        for turn in (1, 2, 7):
            freq = sum(decay_takes_over(s, turn, p) for s in seeds) / len(seeds)
            assert abs(freq - p) < 0.03, (p, turn, freq)
    assert first != [decay_takes_over(s, 4, 0.3) for s in seeds]  # another turn, other draws
    # The first takeover turn is geometric: P(first at turn t) = (1 - p)^(t-1) p.
    p = 0.4
    firsts = [next((t for t in range(1, 50) if decay_takes_over(s, t, p)), None) for s in seeds]
    for t in (1, 2, 3):
        freq = sum(f == t for f in firsts) / len(seeds)
        assert abs(freq - (1 - p) ** (t - 1) * p) < 0.03, (t, freq)
