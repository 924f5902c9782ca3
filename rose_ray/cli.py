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

from rose_ray.errors import InputError


class UsageError(InputError):
    """Bad user input: printed as `rose-ray: error: ...`, exit status 2."""


def _games(args: argparse.Namespace) -> int:
    from rose_ray.envs.worlds import get_world, world_of_item

    world = get_world(args.world or world_of_item(args.show))
    catalogue = world.catalogue(args.mapping)
    if args.show is not None:
        game = catalogue.game(args.show)
        g = world.game()
        try:
            first = g.load(game)
        finally:
            g.close()
        print(f"{game.item_id}  task={game.task}  variation={game.variation}  split={catalogue.split_of(game)}")
        print(first.observation)
        return 0
    counts = catalogue.task_counts()
    width = max(len(t) for t in counts)
    print(f"{world.name}, mapping {catalogue.mapping}: {len(catalogue)} games, {len(counts)} tasks")
    print(f"{'id':<5} {'task':<{width}} {'first':>6} {'all':>5} {'train':>6} {'dev':>5} {'test':>5}")
    firsts: dict[str, str] = {}
    for g in catalogue.games:
        firsts.setdefault(g.task, g.item_id)
    for task, c in counts.items():
        print(
            f"{c.get('task_id', ''):<5} {task:<{width}} {firsts[task].rsplit('_', 1)[1]:>6} {c['all']:>5} "
            f"{c['train']:>6} {c['dev']:>5} {c['test']:>5}"
        )
    sizes = {s: len(catalogue.split(s)) for s in ("train", "dev", "test")}
    print(f"{'':<5} {'total':<{width}} {'':>6} {len(catalogue):>5} {sizes['train']:>6} {sizes['dev']:>5} {sizes['test']:>5}")
    return 0


def _play(args: argparse.Namespace) -> int:
    from rose_ray.envs.protocol import parse_action
    from rose_ray.envs.worlds import get_world, world_of_item

    world = get_world(args.world or world_of_item(args.item))
    game = world.catalogue(args.mapping).game(args.item)
    protocol = world.protocol
    if args.instruction_from:
        protocol = protocol.from_dataset(args.instruction_from)
    interactive = sys.stdin.isatty()
    with world.game(max_turns=args.max_turns) as g:
        first = g.load(game)
        for role, text in protocol.opening():
            print(f"--- {role} ---\n{text}\n")
        print(f"--- user ---\n{first.observation}\n")
        print("Type a reply as a model would ('Thought: ... Action: ...'), or just the action.")
        print("':valid' lists valid actions (ScienceWorld), ':quit' ends.\n")
        result = first
        while not result.done:
            try:
                line = input(f"[turn {g.turn + 1}] > ") if interactive else input()
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
            action = parse_action(reply).action
            result = g.step(action)
            print(f"--- assistant ---\n{reply}\n--- user ---\n{result.observation}")
            print(f"(score {result.raw_score}, normalised {result.score:.2f}, turn {result.turn})\n")
        print(
            f"Episode over: score {result.raw_score} ({result.score:.2f}), "
            f"turns {g.turn}, {result.end_reason or 'stopped'}"
        )
    return 0


def _init_tiny(args: argparse.Namespace) -> int:
    from rose_ray.models import count_parameters, init_tiny, load_model

    paths = init_tiny(args.out, seed=args.seed, style=args.style)
    for role, path in paths.items():
        print(f"{role}: {path} ({count_parameters(load_model(path)):,} parameters)")
    return 0


def world_args(g: argparse.ArgumentParser) -> None:
    from rose_ray.envs.worlds import DEFAULT_WORLD, WORLDS, get_world

    g.add_argument("--world", choices=sorted(WORLDS),
                   help=f"default: the world an item id names, else {DEFAULT_WORLD}")
    mappings = get_world(DEFAULT_WORLD).mappings
    g.add_argument("--mapping", choices=list(mappings),
                   help=f"ScienceWorld's item-id mapping (default {mappings[0]})")


def history_arg(g: argparse.ArgumentParser) -> None:
    g.add_argument("--history", choices=["template", "sampled"], default="template",
                   help="earlier turns in each prompt: as the chat template renders the conversation, as a chat API "
                        "does (the card's; default), or as their ids were sampled (chat.history)")


def conversation_args(g: argparse.ArgumentParser) -> None:
    history_arg(g)
    g.add_argument("--instruction-from", metavar="JSONL",
                   help="take the instruction and acknowledgement from a dataset's first row "
                        "(default: rose_ray's own wording; `continue`: each row's own)")
    g.add_argument("--enable-thinking", action="store_true",
                   help="turn the chat template's thinking mode on (Qwen3); off by default")


def backend_args(g: argparse.ArgumentParser) -> None:
    """`--backend` and the vllm backend's KV cache, for commands that run local models."""
    from rose_ray.inference.backends import COMMAND_BACKENDS, DEFAULT_COMMAND_BACKEND
    from rose_ray.inference.engine import EngineConfig

    g.add_argument("--backend", choices=COMMAND_BACKENDS, default=DEFAULT_COMMAND_BACKEND,
                   help="the engine of a local model: vllm (vLLM's engine), hf (transformers), or auto: "
                        f"vllm where it is installed, else hf (default {DEFAULT_COMMAND_BACKEND})")
    g.add_argument("--kv-cache-mb", type=float, metavar="MB",
                   help=f"vllm on CPU: the KV cache's size (default {EngineConfig.kv_cache_mb:g})")


def served_args(g: argparse.ArgumentParser) -> None:
    """What a served model (`openai:URL`) needs: its tokenizer here, and the name it is served as."""
    g.add_argument("--tokenizer", help="tokenizer folder of the openai:URL models (prompts go as token ids)")
    g.add_argument("--served-model", default="", help="the model name the openai: server expects "
                                                      "(default: the server's own)")


def context_args(g: argparse.ArgumentParser) -> None:
    g.add_argument("--context-tokens", type=int, default=16384, help="prompt + reply tokens (the card's 16,384)")
    g.add_argument("--context-policy", choices=["end_episode", "drop_oldest"], default="end_episode",
                   help="a prompt that no longer fits: end the episode there (AgentGym's rule, the default; "
                        "its end reason is `context`) or drop the oldest action/observation pairs")


def schema_arg(g: argparse.ArgumentParser) -> None:
    g.add_argument("--schema", choices=["card", "agentgym"], default="card",
                   help="rows as the dataset card writes them (role/content) or as AgentGym does (from/value)")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="rose-ray", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    g = sub.add_parser("games", help="list a world's games: counts per task, splits, mapping")
    world_args(g)
    g.add_argument("--show", metavar="ITEM", help="print one game's first observation (starts the game)")
    g.set_defaults(func=_games)

    g = sub.add_parser("play", help="play one game in the terminal, through the model's protocol")
    g.add_argument("item", help="item id, e.g. sciworld_0 or discoveryworld_5")
    world_args(g)
    g.add_argument("--max-turns", type=int, default=50)
    g.add_argument("--instruction-from", metavar="JSONL", help="take the instruction from a dataset")
    g.set_defaults(func=_play)

    g = sub.add_parser("init-tiny", help="build a tiny tokenizer and tiny Qwen3 student/teacher")
    g.add_argument("--out", required=True)
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--style", choices=["plain", "qwen3"], default="plain",
                   help="qwen3: Qwen3's special tokens (<think> too) and a chat template that behaves like Qwen3's")
    g.set_defaults(func=_init_tiny)

    g = sub.add_parser("train", help="online ROSE (or opd / teacher_sft) on a Ray cluster or this machine")
    g.add_argument("--config", help="YAML config (default: the embedded tiny config)")
    g.add_argument("--resume", metavar="RUN", help="continue a run from its latest checkpoint: a run folder, "
                                                 "or a run_dir such as runs/tiny (its latest version)")
    g.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="config overrides, e.g. steps=20")
    g.set_defaults(func="rose_ray.train:cli_main")

    g = sub.add_parser("warmup", help="build a config's tiny models and warm-ups (cached), e.g. the small tier")
    g.add_argument("--config", help="YAML config (default: the embedded tiny config)")
    g.add_argument("--eval", metavar="SPLIT", choices=["train", "dev", "test"],
                   help="then evaluate the base student and the teacher on the config's eval games of SPLIT")
    g.add_argument("--backend", choices=["auto", "hf", "vllm"], default="hf", help="the engine of --eval")
    g.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="config overrides")
    g.set_defaults(func="rose_ray.recipes.warmup:cli_main")

    g = sub.add_parser("export", help="a Hugging Face folder of the student from a run's kept checkpoint")
    g.add_argument("run", metavar="RUN", help="a run folder (holds config.yaml and checkpoints/), or a run_dir (its latest)")
    g.add_argument("--step", type=int, help="the learner step of a kept checkpoint (default: the latest)")
    g.add_argument("--out", required=True, help="the new folder to write")
    g.set_defaults(func="rose_ray.export:cli_main")

    g = sub.add_parser("check", help="preflight a config: tokenizers, chat templates, games, placement; exit 2 on the first problem")
    g.add_argument("config", nargs="?", help="YAML config")
    g.add_argument("--backends", action="store_true",
                   help="only say which engine backends (hf, vllm, openai) this machine can run, and why not")
    g.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="config overrides")
    g.add_argument("--tokenizer-for", action="append", metavar="MODEL=DIR",
                   help="a local tokenizer folder standing in for a model not on disk (repeatable)")
    g.add_argument("--node", action="append", metavar="[Nx]RES=N,...",
                   help="plan on described nodes instead of a cluster, e.g. --node 2xCPU=64,GPU=8 (repeatable)")
    g.add_argument("--address", help="Ray cluster to plan on (default: RAY_ADDRESS, else a local cluster)")
    g.add_argument("--total", action="store_true", help="plan on total resources, not what is free now")
    _memory_arguments(g)
    g.set_defaults(func="rose_ray.check:check_main")

    # --- plan (cluster) ---
    g = sub.add_parser("plan", help="print where each actor of a config would go on the cluster; exit 2 if it can't fit")
    g.add_argument("--config", help="YAML config (default: the embedded tiny config)")
    g.add_argument("--address", help="Ray cluster address (default: RAY_ADDRESS, else a local cluster)")
    g.add_argument("--total", action="store_true", help="plan on total resources, not what is free now")
    g.add_argument("--node", action="append", metavar="[Nx]RES=N,...",
                   help="plan on described nodes instead of a cluster, e.g. --node 2xCPU=64,GPU=8 (repeatable)")
    g.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="config overrides, e.g. env.workers=8")
    _memory_arguments(g)
    g.set_defaults(func="rose_ray.placement:plan_main")
    # --- end plan ---

    g = sub.add_parser("eval", help="evaluate a model on held-out games (Score / Success / Pass)")
    g.add_argument("--model", help="local model folder, or openai:URL of a served model")
    g.add_argument("--split", default="test", help="train, dev, test, all, agenteval_test, or an id-list file")
    g.add_argument("--n", type=int, default=200, help="games, a task-stratified sample (0 = the whole split)")
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--tasks", default="", help="comma-separated task names: only their games (a training run's "
                                                 "`tasks:`; with the same --n and --seed, its eval games)")
    g.add_argument("--max-turns", type=int,
                   help="turns per game (default: sciworld 20; discoveryworld the paper's limits, 100 for Easy "
                        "and unit tests, 1,000 for Normal and Challenge, which this replaces)")
    g.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    g.add_argument("--max-new-tokens", type=int, default=512)
    world_args(g)
    g.add_argument("--judge", metavar="MODEL",
                   help="discoveryworld: score knowledge with this judge (a local folder, or openai:URL)")
    g.add_argument("--judge-model", default="", metavar="NAME", help="the model name an openai: judge server expects")
    g.add_argument("--judge-max-new-tokens", type=int, default=800, help="the judge's answer budget (the paper's 800)")
    g.add_argument("--knowledge-from", choices=["thoughts", "report"], default="thoughts",
                   help="what the judge reads: the agent's thoughts while playing (the paper's scorer, default) "
                        "or its answer to a question asked when the episode ends")
    g.add_argument("--judge-thinking", choices=["on", "off"],
                   help="the judge's chat-template thinking switch (default: off for a local folder, "
                        "the server's own for openai:)")
    g.add_argument("--teacher", help="with --handoff K: the teacher plays from turn K+1")
    g.add_argument("--handoff", type=int)
    g.add_argument("--concurrency", type=int, default=8, help="episodes at once")
    g.add_argument("--env-workers", type=int, default=1)
    context_args(g)
    conversation_args(g)
    backend_args(g)
    served_args(g)
    g.add_argument("--out", help="results prefix: writes OUT.json and OUT.md")
    g.add_argument("--compare", nargs="+", metavar="RESULT.json", help="print results side by side")
    g.set_defaults(func="rose_ray.evaluate:cli_main")

    def play_args(g: argparse.ArgumentParser, temperature: float) -> None:
        g.add_argument("--seed", type=int, default=0)
        g.add_argument("--temperature", type=float, default=temperature)
        g.add_argument("--max-new-tokens", type=int, default=512)
        g.add_argument("--concurrency", type=int, default=8, help="episodes at once")
        world_args(g)
        context_args(g)
        conversation_args(g)
        schema_arg(g)
        backend_args(g)
        served_args(g)

    g = sub.add_parser("collect", help="write student prefixes: the first K turns of each game")
    g.add_argument("--model", required=True, help="local model folder, or openai:URL of a served model")
    g.add_argument("--turns", type=int, default=5)
    g.add_argument("--split", default="train")
    g.add_argument("--n", type=int, default=0, help="a task-stratified sample (0 = the whole split)")
    g.add_argument("--out", required=True)
    play_args(g, 1.0)
    g.set_defaults(func="rose_ray.collect:collect_main")

    g = sub.add_parser("continue", help="replay recorded prefixes, then let the teacher play on")
    g.add_argument("--teacher", required=True, help="local model folder, or openai:URL of a served model")
    g.add_argument("--student", help="tokenizer owner of the output ids (default: the teacher's)")
    g.add_argument("--in", dest="input", required=True)
    g.add_argument("--max-turns", type=int, default=10, help="turns in all, prefix included")
    g.add_argument("--out", required=True)
    play_args(g, 0.0)
    g.set_defaults(func="rose_ray.collect:continue_main")

    g = sub.add_parser("gold", help="write gold demonstrations (ScienceWorld's gold paths)")
    g.add_argument("--split", default="train")
    g.add_argument("--n", type=int, default=0, help="a task-stratified sample (0 = the whole split)")
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--workers", type=int, default=2, help="games at once")
    g.add_argument("--observe", action="store_true",
                   help="paths that look before they choose and name things as the game shows them, "
                        "replayed to check they still succeed (the small tier's teacher warm-up)")
    world_args(g)
    g.add_argument("--instruction-from", metavar="JSONL",
                   help="take the instruction and acknowledgement from a dataset's first row")
    schema_arg(g)
    g.add_argument("--out", required=True)
    g.set_defaults(func="rose_ray.collect:gold_main")

    from rose_ray.envs.worlds import get_world

    g = sub.add_parser("check-data", help="validate a JSONL dataset and tell its item-id mapping")
    g.add_argument("file")
    g.add_argument("--mapping", choices=list(get_world(None).mappings), help="fail unless it is this one")
    g.add_argument("--sample", type=int, default=20, help="rows whose task description is checked")
    g.add_argument("--no-jvm", action="store_true", help="check only the rows' task names")
    g.set_defaults(func="rose_ray.collect:check_data_main")

    # --- serve (inference) ---
    g = sub.add_parser("serve", help="OpenAI-compatible server over a vLLM or transformers engine")
    g.add_argument("model", help="local HF model folder")
    backend_args(g)
    g.add_argument("--port", type=int, default=8000)
    g.add_argument("--host", default="127.0.0.1", help="bind address (default: localhost only)")
    g.add_argument("--api-key", default=None, help="require 'Authorization: Bearer KEY' (default: $ROSE_RAY_API_KEY)")
    g.add_argument("--served-model-name", default=None, help="the 'model' clients send (default: MODEL)")
    g.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16"])
    g.add_argument("--max-batch-size", type=int, default=16)
    g.add_argument("--max-wait-ms", type=float, default=5.0)
    g.add_argument("--context-tokens", type=int, default=4096)
    g.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    g.set_defaults(func="rose_ray.inference.server:cli_main")
    # --- end serve ---

    # --- sft (learner) ---
    g = sub.add_parser("sft", help="offline SFT on AgentGym-schema JSONL conversations")
    g.add_argument("--data", required=True)
    g.add_argument("--model", required=True)
    g.add_argument("--out", required=True, help="output Hugging Face folder")
    g.add_argument("--epochs", type=int, default=1)
    g.add_argument("--batch-size", type=int, default=8, help="rows per optimizer step")
    g.add_argument("--lr", type=float, default=1e-5)
    g.add_argument("--schedule", default="constant", choices=["constant", "linear", "cosine"])
    g.add_argument("--warmup-steps", type=int, default=0)
    g.add_argument("--ranks", type=int, default=1, help="DeepSpeed data-parallel ranks")
    g.add_argument("--zero-stage", type=int, default=0, choices=[0, 1, 2, 3])
    g.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    g.add_argument("--max-tokens", type=int, default=4096,
                   help="tokens per packed row, and per micro-batch (rows share one while they fit)")
    g.add_argument("--owners", default="student,teacher", help="owners whose tokens are trained")
    g.add_argument("--history", choices=["template", "sampled"], default="template",
                   help="train on the chat template's rendering of each whole conversation (the card's SFT; default) "
                        "or on per-turn pieces as an engine with chat.history=sampled builds them")
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--threads", type=int, default=1, help="torch threads per rank")
    g.set_defaults(func="rose_ray.recipes.sft:cli_main")
    # --- end sft ---
    return p


def _memory_arguments(g: argparse.ArgumentParser) -> None:
    """The GPU memory plan's inputs (`plan` and `check`)."""
    g.add_argument("--gpu-memory", type=float, metavar="GIB",
                   help="memory of each GPU in GiB (an H100 80GB: 79.6, an H200: 140.4); default: from the "
                        "nodes' accelerator_type, else the plan prints each role's needs without checking them")
    g.add_argument("--model-config-for", action="append", metavar="MODEL=DIR",
                   help="a folder with the config.json of a model that is not on disk (repeatable; the "
                        "Qwen3 sizes ship with rose_ray)")


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    # KEY=VALUE overrides after a flag (`warmup --eval dev seed=1`): argparse leaves them over
    if extra and isinstance(getattr(args, "overrides", None), list) and all(
            "=" in e and not e.startswith("-") for e in extra):
        args.overrides += extra
    elif extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    func = args.func
    if isinstance(func, str):  # "module:function", imported only when used
        module, name = func.split(":")
        func = getattr(importlib.import_module(module), name)
    from rose_ray.inference.openai import OpenAIServerError
    from rose_ray.models import ModelNotAvailable

    try:
        return int(func(args) or 0)
    except (InputError, FileNotFoundError, ModelNotAvailable) as e:  # bad input: its one line; a bug keeps its traceback
        if os.environ.get("ROSE_RAY_DEBUG"):
            raise
        message = e.args[0] if isinstance(e, KeyError) and e.args else e
        print(f"rose-ray {args.command}: error: {message}", file=sys.stderr)
        return 2
    except OpenAIServerError as e:  # a served model failed a command (not bad input): exit 1, said plainly
        if os.environ.get("ROSE_RAY_DEBUG"):
            raise
        from rose_ray.reliability import describe_error

        print(f"rose-ray {args.command}: error: a served model failed: {describe_error(e)}", file=sys.stderr)
        return 1
    except BrokenPipeError:  # output piped into `head`
        sys.stderr.close()
        return 0
    except KeyboardInterrupt:
        print(f"rose-ray {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
