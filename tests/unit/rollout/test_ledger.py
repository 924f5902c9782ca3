"""The episode ledger (rollout/ledger.py) alone: the game sampler is seeded epoch by epoch and
resumes from its state, and the ledger gives every draw exactly one outcome in episodes.jsonl
across going back to a checkpoint."""

from __future__ import annotations

from pathlib import Path

import pytest

from rose_ray.rollout.ledger import EpisodeLedger, GameSampler
from rose_ray.types import GameId
from tests.unit.test_reliability import read_jsonl


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


def test_the_ledger_gives_every_draw_one_outcome_across_going_back():
    games = [GameId("t", i, f"sciworld_{i}") for i in range(5)]

    def ledger(path, fresh=True):
        return EpisodeLedger(path, GameSampler(games, seed=3), fresh=fresh)

    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "episodes.jsonl"
        a = ledger(path)
        d = [a.draw() for _ in range(4)]
        a.record(d[0].episode_id, "trained", step=1)
        a.record(d[1].episode_id, "dropped_stale")
        state = a.state_dict()  # d[2], d[3] open at the checkpoint
        more = [a.draw() for _ in range(3)]  # crosses an epoch: 7 draws of 5 games
        a.record(d[2].episode_id, "trained", step=2)
        a.record(more[0].episode_id, "failed")
        a.close()
        # Going back: the file is cut, the open episodes come first, then the same draws again.
        b = ledger(path, fresh=False)
        b.load_state_dict(state)
        again = [b.draw() for _ in range(5)]
        assert [x.n for x in again] == [2, 3, 4, 5, 6]
        assert [x.game for x in again] == [d[2].game, d[3].game] + [m.game for m in more]
        assert (again[0].epoch, again[0].position) == (d[2].epoch, d[2].position)  # the same decay seed
        b.record(again[0].episode_id, "trained", step=2)
        b.stop()  # the rest was in flight
        b.close()
        records = read_jsonl(path)
        assert [(r["n"], r["outcome"]) for r in records] == [
            (0, "trained"), (1, "dropped_stale"), (2, "trained"), (3, "in_flight"), (4, "in_flight"),
            (5, "in_flight"), (6, "in_flight")]


def test_going_back_to_a_file_shorter_than_its_checkpoint_never_pads_it(tmp_path, capsys):
    """A checkpoint records episodes.jsonl's length; a file found shorter (records lost with
    the machine) was lengthened with NUL bytes by `truncate` before, a line no reader can parse.
    Now what is there stays, a cut last line is dropped, the loss is said, and what the run
    writes next starts on a line of its own."""
    games = [GameId("boil", i, f"sciworld_{i}") for i in range(5)]
    path = tmp_path / "episodes.jsonl"
    ledger = EpisodeLedger(path, GameSampler(games, seed=0))
    drawn = [ledger.draw() for _ in range(4)]
    for d in drawn[:3]:
        ledger.record(d.episode_id, "trained", step=1)
    state = ledger.state_dict()
    ledger.close()
    path.write_bytes(path.read_bytes()[: state["offset"] - 10])  # the tail lost, mid-line
    again = EpisodeLedger(path, GameSampler(games, seed=0), fresh=False)
    again.load_state_dict(state)
    assert b"\0" not in path.read_bytes() and path.read_bytes().endswith(b"\n")
    again.record(again.draw().episode_id, "trained", step=2)
    again.close()
    records = read_jsonl(path)
    assert [r["episode"] for r in records] == ["e0", "e1", "e3"]
    assert "fewer than the" in capsys.readouterr().err
