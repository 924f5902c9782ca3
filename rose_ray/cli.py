"""`rose-ray` entry point. Each subcommand parses its arguments here and runs lazily from its
own module, so `rose-ray games` never imports torch.

Bad input (arguments, config, data, a model that is not there) exits with status 2 and a
one-line message naming what is wrong (ROSE_RAY_DEBUG=1 shows the traceback instead).
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys


class UsageError(Exception):
    """Bad user input: printed as `rose-ray: error: ...`, exit status 2."""


def _games(args: argparse.Namespace) -> int:
    from rose_ray.envs.catalogue import Catalogue

    catalogue = Catalogue(args.mapping)
    if args.show is not None:
        from rose_ray.envs.sciworld import SciWorldGame

        game = catalogue.game(args.show)
        with SciWorldGame() as g:
            first = g.load(game)
        print(f"{game.item_id}  task={game.task}  variation={game.variation}  split={catalogue.split_of(game)}")
        print(first.observation)
        return 0
    counts = catalogue.task_counts()
    width = max(len(t) for t in counts)
    print(f"mapping {catalogue.mapping}: {len(catalogue)} games, {len(counts)} tasks")
    print(f"{'id':<5} {'task':<{width}} {'first':>6} {'all':>5} {'train':>6} {'dev':>5} {'test':>5}")
    for task, c in counts.items():
        first = catalogue.find(task, 0).item_id
        print(
            f"{c['task_id']:<5} {task:<{width}} {first.split('_')[1]:>6} {c['all']:>5} "
            f"{c['train']:>6} {c['dev']:>5} {c['test']:>5}"
        )
    sizes = {s: len(catalogue.split(s)) for s in ("train", "dev", "test")}
    print(f"{'':<5} {'total':<{width}} {'':>6} {len(catalogue):>5} {sizes['train']:>6} {sizes['dev']:>5} {sizes['test']:>5}")
    return 0


def _play(args: argparse.Namespace) -> int:
    from rose_ray.envs.catalogue import Catalogue
    from rose_ray.envs.protocol import Protocol, normalise_score, parse_action
    from rose_ray.envs.sciworld import SciWorldGame

    game = Catalogue(args.mapping).game(args.item)
    protocol = Protocol.from_dataset(args.instruction_from) if args.instruction_from else Protocol()
    interactive = sys.stdin.isatty()
    with SciWorldGame(max_turns=args.max_turns) as g:
        first = g.load(game)
        for role, text in protocol.opening():
            print(f"--- {role} ---\n{text}\n")
        print(f"--- user ---\n{first.observation}\n")
        print("Type a reply as a model would ('Thought: ... Action: ...'), or just the action.")
        print("':valid' lists valid actions, ':quit' ends.\n")
        result = first
        while not result.done:
            try:
                line = input(f"[turn {g.turn + 1}] > ") if interactive else input()
            except EOFError:
                break
            if line.strip() == ":quit":
                break
            if line.strip() == ":valid":
                print("\n".join(sorted(g.valid_actions())))
                continue
            # A typed "\n" stands for a newline, so a whole Thought/Action reply fits one line.
            reply = (line if "Action:" in line else f"Action: {line}").replace("\\n", "\n")
            action = parse_action(reply).action
            result = g.step(action)
            print(f"--- assistant ---\n{reply}\n--- user ---\n{result.observation}")
            print(f"(score {result.raw_score}, normalised {normalise_score(result.raw_score):.2f}, turn {result.turn})\n")
        print(
            f"Episode over: score {result.raw_score} ({normalise_score(result.raw_score):.2f}), "
            f"turns {g.turn}, {result.end_reason or 'stopped'}"
        )
    return 0


def _init_tiny(args: argparse.Namespace) -> int:
    from rose_ray.models import count_parameters, init_tiny, load_model

    paths = init_tiny(args.out, seed=args.seed)
    for role, path in paths.items():
        print(f"{role}: {path} ({count_parameters(load_model(path)):,} parameters)")
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="rose-ray", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    g = sub.add_parser("games", help="list ScienceWorld games: counts per task, splits, mapping")
    g.add_argument("--mapping", default="agentgym", choices=["agentgym", "agentgym_traj"])
    g.add_argument("--show", metavar="ITEM", help="print one game's first observation (starts a JVM)")
    g.set_defaults(func=_games)

    g = sub.add_parser("play", help="play one game in the terminal, through the model's protocol")
    g.add_argument("item", help="item id, e.g. sciworld_0")
    g.add_argument("--mapping", default="agentgym", choices=["agentgym", "agentgym_traj"])
    g.add_argument("--max-turns", type=int, default=50)
    g.add_argument("--instruction-from", metavar="JSONL", help="take the instruction from a dataset")
    g.set_defaults(func=_play)

    g = sub.add_parser("init-tiny", help="build a tiny tokenizer and tiny Qwen3 student/teacher")
    g.add_argument("--out", required=True)
    g.add_argument("--seed", type=int, default=0)
    g.set_defaults(func=_init_tiny)

    # --- serve (inference) ---
    g = sub.add_parser("serve", help="OpenAI-compatible server over a transformers engine")
    g.add_argument("model")
    g.add_argument("--port", type=int, default=8000)
    g.add_argument("--host", default="127.0.0.1")
    g.add_argument("--api-key", default=None)
    g.set_defaults(func="rose_ray.inference.server:cli_main")
    # --- end serve ---

    # --- sft (learner) ---
    g = sub.add_parser("sft", help="offline SFT on AgentGym-schema JSONL conversations")
    g.add_argument("--data", required=True)
    g.add_argument("--model", required=True)
    g.add_argument("--out", required=True)
    g.set_defaults(func="rose_ray.learner.sft:cli_main")
    # --- end sft ---
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    func = args.func
    if isinstance(func, str):  # "module:function", imported only when used
        module, name = func.split(":")
        func = getattr(importlib.import_module(module), name)
    from rose_ray.models import ModelNotAvailable

    try:
        return int(func(args) or 0)
    except (UsageError, ValueError, KeyError, FileNotFoundError, ModelNotAvailable) as e:
        if os.environ.get("ROSE_RAY_DEBUG"):
            raise
        message = e.args[0] if isinstance(e, KeyError) and e.args else e
        print(f"rose-ray {args.command}: error: {message}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # output piped into `head`
        sys.stderr.close()
        return 0
    except KeyboardInterrupt:
        print(f"rose-ray {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
