"""How far apart are chat.history=sampled and =template? Prompt tokens that differ per turn,
on the Qwen3-style tiny models (`rose-ray init-tiny --style qwen3`: Qwen3's special tokens and a
template that rewrites history as Qwen3's does).

The tiny student plays real ScienceWorld test games with sampled history (temperature 1, so its
replies are sampled ids, not the tokenizer's own split of their text). At every turn the prompt
the engine got (the sampled ids) is set beside the template's own rendering of the same
conversation (what a chat API sends, and what chat.history=template gives), and the tokens that
differ are counted exchange by exchange (the opening and first observation, then each reply with
the observation after it): those that a longest matching alignment (difflib) of the two leaves
unmatched. Per exchange, because the untrained student repeats itself and a whole-prompt
alignment would pair one turn's reply with another's.

    python bench/history.py                 # 16 games, 10 turns, thinking off and on
    python bench/history.py --quick         # 4 games, 5 turns

Prints one table per thinking setting and writes bench/results/history.json.
"""

from __future__ import annotations

import argparse
import asyncio
import difflib
import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

RESULTS = Path(__file__).resolve().parent / "results" / "history.json"


def differing(a: list[int], b: list[int]) -> int:
    """Tokens of `a` and `b` outside their longest matching alignment."""
    matched = sum(m.size for m in difflib.SequenceMatcher(None, a, b, autojunk=False).get_matching_blocks())
    return len(a) + len(b) - 2 * matched


def exchanges(turns: list[Any]) -> list[list[int]]:
    """A conversation's ids by exchange: the opening with the first observation, then each reply
    with the observation after it."""
    ids = [t.token_ids for t in turns]
    return [sum(ids[:3], [])] + [sum(ids[i:i + 2], []) for i in range(3, len(ids), 2)]


def per_turn(trajectories: list[Any], template: Any) -> list[dict[str, float]]:
    """For each turn k: mean prompt tokens under sampled and template history, mean differing."""
    rows: dict[int, list[tuple[int, int, int]]] = {}
    for t in trajectories:
        replies = [n for n, turn in enumerate(t.turns) if turn.role == "assistant" and turn.owner != "prompt"]
        for k, n in enumerate(replies, 1):
            sampled = exchanges(t.turns[:n])  # what the engine got
            rendered = exchanges(template.apply_template(t.turns[:n], add_generation_prompt=True))
            rows.setdefault(k, []).append((sum(map(len, sampled)), sum(map(len, rendered)),
                                           sum(differing(a, b) for a, b in zip(sampled, rendered))))
    return [{"turn": k, "games": len(v), "sampled": sum(x[0] for x in v) / len(v),
             "template": sum(x[1] for x in v) / len(v), "differing": sum(x[2] for x in v) / len(v)}
            for k, v in sorted(rows.items())]


def play(models: dict[str, Path], thinking: bool, args: argparse.Namespace) -> list[Any]:
    from rose_ray.envs.worlds import get_world
    from rose_ray.inference.engine import EngineConfig
    from rose_ray.rollout.play import PlaySpec
    from rose_ray.rollout.play import play as play_games
    from rose_ray.types import SamplingParams

    games = get_world("sciworld").catalogue(None).sample("test", args.games, 0)
    engine = EngineConfig(model=str(models["student"]), context_tokens=8192, dtype="float32", max_batch_size=8)
    spec = PlaySpec(student=engine, max_turns=args.turns, enable_thinking=thinking, history="sampled",
                    student_sampling=SamplingParams(temperature=1.0, max_new_tokens=args.max_new_tokens, seed=0),
                    concurrency=min(args.games, 4))
    return asyncio.run(play_games(spec, games))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--games", type=int, default=16)
    p.add_argument("--turns", type=int, default=10)
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument("--quick", action="store_true", help="4 games, 5 turns")
    args = p.parse_args()
    if args.quick:
        args.games, args.turns = 4, 5

    from rose_ray.chat import ChatFormat
    from rose_ray.models import load_tokenizer
    from rose_ray.provision.tiny import init_tiny

    t0 = time.perf_counter()
    models = init_tiny(Path(tempfile.mkdtemp(prefix="rose_ray_history_")), seed=0, style="qwen3")
    tokenizer = load_tokenizer(models["student"])
    out: dict[str, Any] = {"games": args.games, "turns": args.turns, "max_new_tokens": args.max_new_tokens}
    for thinking in (False, True):
        played = play(models, thinking, args)
        rows = per_turn(played, ChatFormat(tokenizer, thinking, "template"))
        replies = [u.text for t in played for u in t.turns if u.role == "assistant" and u.owner != "prompt"]
        # The template drops whatever a reply holds before `</think>`; the untrained student writes it at random.
        closing = sum("</think>" in r for r in replies) / max(len(replies), 1)
        key = f"thinking_{'on' if thinking else 'off'}"
        out[key] = {"per_turn": rows, "replies_with_think_close": closing}
        print(f"\nthinking {'on' if thinking else 'off'}: prompt tokens per turn, mean over games "
              f"(sampled history vs the template's rendering); {100 * closing:.0f}% of replies hold </think>")
        print("| turn | games | sampled | template | differing |\n| ---: | ---: | ---: | ---: | ---: |")
        for r in rows:
            print(f"| {r['turn']} | {r['games']} | {r['sampled']:.1f} | {r['template']:.1f} | {r['differing']:.1f} |")
    out["runtime_s"] = round(time.perf_counter() - t0, 1)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(out, indent=2) + "\n")
    print(f"\n{out['runtime_s']} s; results: {RESULTS}")


if __name__ == "__main__":
    main()
