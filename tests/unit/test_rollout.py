"""Buffer backpressure and staleness, handoff policies, the game sampler (no actors needed)."""

from __future__ import annotations

import asyncio

import pytest

from rose_ray.rollout.buffer import TrajectoryBuffer
from rose_ray.rollout.handoff import decay_takes_over, turn_policy
from rose_ray.rollout.ledger import GameSampler
from rose_ray.types import GameId, Trajectory


def traj(i: int, version: int | None) -> Trajectory:
    return Trajectory(GameId("boil", i, f"sciworld_{i}"), [], student_version=version, episode_id=f"e{i}")


def test_buffer_admits_only_up_to_max_lag_plus_one_batches():
    async def main():
        buf = TrajectoryBuffer(batch_episodes=2, max_lag=1)  # capacity 4
        for _ in range(4):
            await asyncio.wait_for(buf.admit(), 1)
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(buf.admit(), 0.2)  # in flight + buffered would pass 4
        await buf.add(traj(0, 0), learner_version=0)
        await buf.add(traj(1, 0), learner_version=0)
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(buf.admit(), 0.2)  # buffered items still count
        batch = await asyncio.wait_for(buf.take_batch(0), 1)
        assert [t.episode_id for t in batch] == ["e0", "e1"]
        await asyncio.wait_for(buf.admit(), 1)  # room again
        assert buf.accounting_holds()

    asyncio.run(main())


def test_buffer_drops_and_counts_stale_samples():
    async def main():
        buf = TrajectoryBuffer(batch_episodes=2, max_lag=1)
        for _ in range(4):
            await buf.admit()
        assert not await buf.add(traj(0, 0), learner_version=2)  # lag 2 > 1: dropped
        assert await buf.add(traj(1, 1), learner_version=2)
        assert await buf.add(traj(2, None), learner_version=2)  # teacher-only: never stale
        await buf.fail()
        assert buf.counters.dropped_stale == 1 and buf.counters.failed == 1
        for _ in range(2):
            await buf.admit()
        # At version 3 the buffered version-1 sample is too old: dropped on the way out.
        waiter = asyncio.create_task(buf.take_batch(3))
        await asyncio.sleep(0.05)
        assert not waiter.done() and buf.counters.dropped_stale == 2  # only e2 is left
        await buf.add(traj(3, 3), learner_version=3)
        batch = await asyncio.wait_for(waiter, 1)
        assert [t.episode_id for t in batch] == ["e2", "e3"]
        assert all(lag <= 1 for lag in buf.lags)
        assert buf.accounting_holds()
        c = buf.counters
        assert c.admitted == c.trained + len(buf.items) + c.dropped_stale + c.failed + buf.in_flight

    asyncio.run(main())


def test_buffer_keeps_lagging_episodes_when_only_teacher_tokens_train():
    """ROSE without its OPD term trains the frozen teacher's tokens only: no lag makes them
    off-policy, so nothing is dropped (backpressure still bounds how far rollouts run ahead)."""
    async def main():
        buf = TrajectoryBuffer(batch_episodes=2, max_lag=1, drop_stale=False)
        for _ in range(4):
            await buf.admit()
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(buf.admit(), 0.2)
        assert await buf.add(traj(0, 0), learner_version=5)  # lag 5: kept
        assert await buf.add(traj(1, 4), learner_version=5)
        batch = await asyncio.wait_for(buf.take_batch(7), 1)
        assert [t.episode_id for t in batch] == ["e0", "e1"] and buf.counters.dropped_stale == 0
        assert buf.lags == [7, 3]  # lags are still recorded (async/policy_lag)
        assert buf.accounting_holds()

    asyncio.run(main())


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


def test_the_algorithm_section_is_its_recipes_and_a_new_name_starts_it_afresh(tmp_path):
    """`algorithm` is one typed section chosen by name; a later layer that names another recipe
    or turn policy keeps none of the old kind's keys, a key the kind lacks is named."""
    from rose_ray.config import ConfigError, load_config, to_yaml

    rose = load_config(None).algorithm  # the tiny YAML: {name: rose, handoff: {policy: fixed, k: 2}}
    assert (rose.name, rose.turn_policy(), rose.lam) == ("rose", turn_policy("fixed", k=2), 0.0)
    assert load_config(None, ["algorithm=opd"]).algorithm.turn_policy() == turn_policy("none")
    decay = load_config(None, ["algorithm.handoff.policy=decay", "algorithm.handoff.p0=0.3"]).algorithm
    assert decay.turn_policy() == turn_policy("decay", p0=0.3) and decay.lam == 0.0
    sft = load_config(None, ["algorithm=teacher_sft", "algorithm.owners=[teacher]"]).algorithm
    assert (sft.turn_policy(), sft.token_weights().terms["ce"]) == (turn_policy("teacher_only"), {"teacher": 1.0})
    # One line in logs and `rose-ray check`, as the YAML writes the section.
    assert decay.describe().startswith("rose handoff={policy: decay, p0: 0.3, ") and decay.describe().endswith("} lam=0.0")
    assert sft.describe() == "teacher_sft owners=[teacher]"
    for overrides, says in ((["algorithm.handoff.p0=0.3"], "algorithm.handoff.p0: fixed has no such key"),
                            (["algorithm=opd", "algorithm.lam=0.5"], "algorithm.lam: opd has no such key"),
                            (["algorithm.handoff.policy=sometimes"], "algorithm.handoff.policy: must be one of"),
                            (["algorithm.lam=x"], "algorithm.lam: Value 'x'")):
        with pytest.raises(ConfigError, match=says):
            load_config(None, overrides)
    # The section is written out whole, and a run's config.yaml reads back the same.
    saved = tmp_path / "config.yaml"
    saved.write_text(to_yaml(load_config(None, ["algorithm.handoff=on_failure", "algorithm.lam=0.5"])))
    assert load_config(saved, saved=True).algorithm == load_config(None, ["algorithm.handoff=on_failure",
                                                                           "algorithm.lam=0.5"]).algorithm


def test_moved_keys_are_refused_by_name_and_carried_in_a_saved_run(tmp_path):
    from rose_ray.config import ConfigError, load_config

    for key, place in (("rollout.handoff.k=1", "algorithm.handoff"), ("learner.lam=0.5", "algorithm.lam"),
                       ("learner.sft_owners=[teacher]", "algorithm.owners")):
        with pytest.raises(ConfigError, match=f"key '{key.split('=')[0].replace('.k', '')}': removed; moved to {place}"):
            load_config(None, [key])
    # A run saved before the move resumes with its settings where they live now.
    old = tmp_path / "config.yaml"
    old.write_text("algorithm: rose\nrollout:\n  handoff: {policy: decay, p0: 0.25}\nlearner:\n  lam: 0.5\n"
                   "  sft_owners: [student, teacher]\n")
    assert load_config(old, saved=True).algorithm == load_config(
        None, ["algorithm={name: rose, handoff: {policy: decay, p0: 0.25}, lam: 0.5}"]).algorithm
    old.write_text("algorithm: teacher_sft\nrollout:\n  handoff: {policy: fixed, k: 5}\nlearner:\n"
                   "  sft_owners: [teacher]\n")
    assert load_config(old, saved=True).algorithm.owners == ["teacher"]


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


def test_game_sampler_is_seeded_epoch_by_epoch_and_resumable():
    games = [GameId("boil", i, f"sciworld_{i}") for i in range(5)]
    a = GameSampler(games, seed=1)
    first_epoch = [a.next() for _ in range(5)]
    assert sorted(g.variation for g in first_epoch) == list(range(5))
    second_epoch = [a.next() for _ in range(5)]
    assert sorted(g.variation for g in second_epoch) == list(range(5))
    assert first_epoch != second_epoch  # reshuffled each epoch
    b = GameSampler(games, seed=1)
    assert [b.next() for _ in range(5)] == first_epoch
    state = a.state_dict()
    rest = [a.next() for _ in range(3)]
    c = GameSampler(games, seed=999)
    c.load_state_dict(state)
    assert [c.next() for _ in range(3)] == rest
    with pytest.raises(ValueError):
        GameSampler([], seed=0)


def test_a_file_that_is_not_yaml_is_named_with_its_line(tmp_path, capsys):
    from rose_ray.cli import main

    bad = tmp_path / "bad.yaml"
    bad.write_text("steps: [1,\nmode: sync\n")
    assert main(["check", str(bad)]) == 2
    assert f"{bad}: not valid YAML at line 3, column 1" in capsys.readouterr().err
    ok = tmp_path / "ok.yaml"
    ok.write_text("steps: 1\n")
    assert main(["check", str(ok), "algorithm={name"]) == 2
    assert "override 'algorithm={name': its value is not valid YAML" in capsys.readouterr().err
