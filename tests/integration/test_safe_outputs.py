"""The half of tests/unit/test_safe_outputs.py whose tests start processes
(Ray, JVMs, servers or commands); that file's docstring says what both halves check."""

from __future__ import annotations

from rose_ray.cli import main
from rose_ray.envs.sciworld.protocol import PROTOCOL


def test_gold_streams_its_rows_and_refuses_to_replace_its_out_unasked(tmp_path, capsys):
    """`gold` (as `collect` and `continue`): rows go through OUT.partial, OUT is written when
    all are done, and an existing OUT is replaced only with --overwrite."""
    from rose_ray.rows import read_jsonl

    out = tmp_path / "gold.jsonl"
    args = ["gold", "--split", "train", "--n", "1", "--workers", "1", "--out", str(out)]
    assert main(args) == 0
    rows = read_jsonl(out)
    assert len(rows) == 1 and not (tmp_path / "gold.jsonl.partial").exists()
    out.write_text(out.read_text() + "\n")  # the user's copy, changed
    mine = out.read_bytes()
    assert main(args) == 2
    assert f"--out {out}: already exists; give another --out, or --overwrite" in capsys.readouterr().err
    assert out.read_bytes() == mine
    assert main([*args, "--overwrite"]) == 0
    again = read_jsonl(out)
    # ScienceWorld's heat transfer runs in a hash set's order, which changes from run to run: the
    # same game and actions can read a few degrees apart (rose_ray/envs/sciworld/game.py). A CI
    # run saw this test's rows differ (its diff cut off) on this boil game, then 9 runs here did
    # not. Everything else of the row must be the same.
    assert len(again) == len(rows)
    for a, b in zip(again, rows):
        rest = ("conversations", "score", "success")
        assert {k: v for k, v in a.items() if k not in rest} == {k: v for k, v in b.items() if k not in rest}
        assert [m["role"] for m in a["conversations"]] == [m["role"] for m in b["conversations"]]
        assert all(PROTOCOL.same_observation(x["content"], y["content"])
                   for x, y in zip(a["conversations"], b["conversations"]))
