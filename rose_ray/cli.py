"""`rose-ray` entry point. Each subcommand parses its arguments here and runs lazily from its
own module, so `rose-ray games` never imports torch.

Bad input (arguments, config, data, a model that is not there) exits with status 2 and a
one-line message naming what is wrong (ROSE_RAY_DEBUG=1 shows the traceback instead).
"""

from __future__ import annotations

import argparse
import os
import pkgutil
import shlex
import sys
from dataclasses import fields
from typing import Any

from rose_ray import __version__
from rose_ray.commands import COMMANDS, MAPPINGS, TOOLS, ServeCommand, WorldSettings, add_flags
from rose_ray.envs.protocol import parse_action
from rose_ray.envs.worlds import get_world, world_of_item
from rose_ray.errors import InputError


def _games(args: argparse.Namespace) -> int:
    world = get_world(args.world or world_of_item(args.show))
    catalogue = world.catalogue(args.mapping)
    if args.show is not None:
        game = catalogue.game(args.show)
        with world.game() as g:
            first = g.load(game)
        print(f"{game.item_id}  task={game.task}  variation={game.variation}  split={catalogue.split_of(game)}")
        print(first.observation)
        return 0
    counts = catalogue.task_counts()
    width = max(len(t) for t in counts)
    row = f"{{:<5}} {{:<{width}}} {{:>6}} {{:>5}} {{:>6}} {{:>5}} {{:>5}}".format
    print(f"{world.name}, mapping {catalogue.mapping}: {len(catalogue)} games, {len(counts)} tasks")
    print(row("id", "task", "first", "all", "train", "dev", "test"))
    firsts = {g.task: g.index for g in reversed(catalogue.games)}  # each task's first game
    for task, c in counts.items():
        print(row(c.get("task_id", ""), task, firsts[task], c["all"], c["train"], c["dev"], c["test"]))
    print(row("", "total", "", len(catalogue), *(len(catalogue.split(s)) for s in ("train", "dev", "test"))))
    return 0


def _play(args: argparse.Namespace) -> int:
    world = get_world(args.world or world_of_item(args.item))
    game = world.catalogue(args.mapping).game(args.item)
    protocol = world.protocol.from_dataset(args.instruction_from) if args.instruction_from else world.protocol
    with world.game(max_turns=args.max_turns) as g:
        result = g.load(game)
        for role, text in protocol.opening():
            print(f"--- {role} ---\n{text}\n")
        print(f"--- user ---\n{result.observation}\n")
        print("Type a reply as a model would ('Thought: ... Action: ...'), or just the action.")
        print("':valid' lists valid actions (ScienceWorld), ':quit' ends.\n")
        while not result.done:
            try:
                line = input(f"[turn {g.turn + 1}] > " if sys.stdin.isatty() else "")
            except EOFError:
                break
            if line.strip() == ":quit":
                break
            if line.strip() == ":valid":
                try:
                    print("\n".join(sorted(g.valid_actions())))
                except NotImplementedError as e:
                    print(e)
                continue
            # A typed "\n" stands for a newline, so a whole Thought/Action reply fits one line.
            reply = (line if "Action:" in line else f"Action: {line}").replace("\\n", "\n")
            result = g.step(parse_action(reply).action)
            print(f"--- assistant ---\n{reply}\n--- user ---\n{result.observation}")
            print(f"(score {result.raw_score}, normalised {result.score:.2f}, turn {result.turn})\n")
        print(f"Episode over: score {result.raw_score} ({result.score:.2f}), turns {g.turn}, "
              f"{result.end_reason or 'stopped'}")
    return 0


def _init_tiny(args: argparse.Namespace) -> int:
    from rose_ray.models import count_parameters, load_model
    from rose_ray.provision.tiny import init_tiny

    for role, path in init_tiny(args.out, seed=args.seed, style=args.style).items():
        print(f"{role}: {path} ({count_parameters(load_model(path)):,} parameters)")
    return 0


def _serve(args: ServeCommand) -> int:
    """`rose-ray serve MODEL`: the hf engine behind inference/server.py (vllm: its own server)."""
    from rose_ray.inference.backends import backend_version, command_engine, make_engine
    from rose_ray.inference.server import OpenAIServer, vllm_server

    if args.model.startswith("openai:"):
        raise InputError(f"serve {args.model}: serve a local model folder (this command is the server)")
    api_key = args.api_key or os.environ.get("ROSE_RAY_API_KEY")
    if (own_server := vllm_server(args)) is not None:
        key = " --api-key KEY" if api_key else ""
        raise InputError(f"--backend {args.backend}: serve the model with vLLM's own OpenAI server, which the openai "
                         f"engine talks to as it does to this one: {shlex.join(own_server)}{key} "
                         "(docs/engines.md#served-models)")
    name = args.served_model_name or args.model
    config = command_engine(args.model, "MODEL", "hf", dtype=args.dtype, max_batch_size=args.max_batch_size,
                            max_wait_ms=args.max_wait_ms, context_tokens=args.context_tokens, threads=args.threads)
    engine = make_engine(config)
    if args.host not in ("127.0.0.1", "localhost", "::1") and not api_key:
        print(f"warning: serving on {args.host} without an API key (anyone who reaches the port can use it; "
              "only requests to an IP address or localhost are answered)", flush=True)
    server = OpenAIServer(engine, name, api_key, max_concurrent=args.max_concurrent)
    print(f"serving {args.model} as {name!r} on http://{args.host}:{args.port}/v1 with the {config.backend.name} backend "
          f"({backend_version(config.backend.name)}; request bodies up to {server.max_body / 2**20:.1f} MiB)", flush=True)
    server.run(args.host, args.port)
    return 0


# Every command, in --help's order: (name, function, help). A "module:function" is imported only when
# used; a command with typed settings (commands.py) has its flags made from them, the others below.
COMMAND_TABLE: list[tuple[str, Any, str]] = [
    ("games", _games, "list a world's games: counts per task, splits, mapping"),
    ("play", _play, "play one game in the terminal, through the model's protocol"),
    ("init-tiny", _init_tiny, "build a tiny tokenizer and tiny Qwen3 student/teacher"),
    ("train", "rose_ray.train:cli_main",
     "online ROSE (or opd / teacher_sft) on a Ray cluster or this machine"),
    ("warmup", "rose_ray.provision.warmup:cli_main",
     "build a config's tiny models and warm-ups (cached), e.g. the small tier"),
    ("export", "rose_ray.export:cli_main",
     "a Hugging Face folder of the student from a run's kept checkpoint"),
    ("check", "rose_ray.check:check_main",
     "preflight a config: tokenizers, chat templates, games, placement; exit 2 on the first problem"),
    ("plan", "rose_ray.check:plan_main",
     "print where each actor of a config would go on the cluster; exit 2 if it can't fit"),
    ("eval", "rose_ray.evaluate:cli_main", "evaluate a model on held-out games (Score / Success / Pass)"),
    ("collect", "rose_ray.collect:collect_main", "write student prefixes: the first K turns of each game"),
    ("continue", "rose_ray.collect:continue_main", "replay recorded prefixes, then let the teacher play on"),
    ("gold", "rose_ray.collect:gold_main", "write gold demonstrations (ScienceWorld's gold paths)"),
    ("migrate", "rose_ray.migrate:cli_main", "rewrite a run's config.yaml from an earlier version of "
                                             "rose_ray in today's keys (the old file kept beside it as "
                                             "config.yaml.old)"),
    ("check-data", "rose_ray.collect:check_data_main",
     "validate a JSONL dataset and tell its item-id mapping"),
    ("serve", _serve, "OpenAI-compatible server over a transformers engine (vLLM: its own server)"),
    ("sft", "rose_ray.recipes.sft:cli_main",
     "offline SFT on dataset rows (the card's role/content schema or AgentGym's from/value)"),
]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="rose-ray", description=__doc__.split("\n\n")[0])
    p.add_argument("--version", action="version", version=f"rose-ray {__version__}")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, func, help_ in COMMAND_TABLE:
        g = sub.add_parser(name, help=help_, description=help_)
        g.set_defaults(func=func)
        if name in COMMANDS or name in TOOLS:
            add_flags(g, COMMANDS.get(name) or TOOLS[name], layers=name in COMMANDS)
    games, play, init_tiny, train, migrate, check_data = (
        sub.choices[n] for n in ("games", "play", "init-tiny", "train", "migrate", "check-data"))
    play.add_argument("item", help="item id, e.g. sciworld_0 or discoveryworld_5")
    for g in (games, play):  # --world and --mapping as the typed commands have them
        for f in fields(WorldSettings):
            g.add_argument(f"--{f.name}", choices=f.metadata["choices"], help=f.metadata["help"])
    games.add_argument("--show", metavar="ITEM", help="print one game's first observation (starts the game)")
    play.add_argument("--max-turns", type=int, default=50, help="turns before the game ends (default: 50)")
    play.add_argument("--instruction-from", metavar="JSONL", help="take the instruction from a dataset")
    init_tiny.add_argument("--out", required=True, help="the folder to build them in (required)")
    init_tiny.add_argument("--seed", type=int, default=0, help="the models' initialization seed (default: 0)")
    init_tiny.add_argument("--style", choices=["plain", "qwen3"], default="plain",
                           help="qwen3: Qwen3's special tokens (<think> too) and a chat template that "
                                "behaves like Qwen3's (default: plain)")
    train.add_argument("--config", metavar="FILE.yaml", help="a training config (default: the embedded "
                                                            "tiny config, rose_ray/configs/tiny.yaml)")
    train.add_argument("--resume", metavar="RUN",
                       help="continue a run from its latest checkpoint, with its own config.yaml: a run "
                            "folder, a run_dir such as runs/tiny (its latest run), or runs/tiny/latest")
    train.add_argument("--print-config", action="store_true",
                       help="print the config the run would start with (merged and checked; as the run's "
                            "config.yaml keeps it, without secrets) and exit")
    train.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="config overrides, e.g. steps=20")
    migrate.add_argument("run", metavar="RUN", help="a run folder, a run_dir such as runs/tiny (its latest "
                                                   "run), or its latest file")
    migrate.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="settings the old run needs now")
    check_data.add_argument("file")
    check_data.add_argument("--mapping", choices=MAPPINGS, help="fail unless it is this one")
    check_data.add_argument("--sample", type=int, default=20,
                            help="rows whose task description is checked (default: 20)")
    check_data.add_argument("--no-jvm", action="store_true", help="check only the rows' task names")
    return p


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    # KEY=VALUE overrides after a flag (`warmup --eval dev seed=1`): argparse leaves them over
    if extra and isinstance(getattr(args, "overrides", None), list) and all(
            "=" in e and not e.startswith("-") for e in extra):
        args.overrides = [*args.overrides, *extra]  # not +=: that would grow the parser's default list
    elif extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    func = pkgutil.resolve_name(args.func) if isinstance(args.func, str) else args.func
    from rose_ray.commands import resolve
    from rose_ray.inference.openai import OpenAIServerError
    from rose_ray.models import ModelNotAvailable

    try:
        typed = getattr(args, "settings", None)  # a command with a typed config (commands.py)
        return int(func(args if typed is None else resolve(typed, args, args.command)) or 0)
    except (InputError, FileNotFoundError, ModelNotAvailable, OpenAIServerError) as e:
        if os.environ.get("ROSE_RAY_DEBUG"):  # else one line (a bug, not caught here, keeps its traceback)
            raise
        from rose_ray.reliability import describe_error

        served = isinstance(e, OpenAIServerError)  # a served model failed a command (not bad input): exit 1
        message = (f"a served model failed: {describe_error(e)}" if served  # else bad input: one line, exit 2
                   else e.args[0] if isinstance(e, KeyError) and e.args else e)
        print(f"rose-ray {args.command}: error: {message}", file=sys.stderr)
        return 1 if served else 2
    except BrokenPipeError:  # output piped into `head`
        sys.stderr.close()
        return 0
    except KeyboardInterrupt:
        print(f"rose-ray {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
