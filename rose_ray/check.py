"""`rose-ray check [--config CONFIG] [k=v ...]`: what to run before asking for GPUs (tokenizers,
chat templates, served engines, games, placement, memory per GPU; docs/seed.md, "Before asking
for GPUs"). The first problem exits 2 naming the key. `rose-ray plan` (plan_main) prints the
placement and memory parts alone.
"""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path
from typing import Any

from rose_ray.config import TrainConfig, default_config_path, load_config
from rose_ray.errors import InputError
from rose_ray.inference.backends import backend_problem, backends_report
from rose_ray.memory import check_memory, format_memory, gpu_memory, memory_plan
from rose_ray.nvidia import gpu_report
from rose_ray.placement import check_cluster, demands, describe_demands, format_plan, parse_nodes

SAMPLE_OBSERVATIONS = (
    "Your task is to boil water. First, focus on the substance. Then, take actions that will "
    "cause it to change its state of matter.\nThis room is called the kitchen. In it, you see: "
    "a stove, which is turned off. a sink, which is turned off. a cupboard. A door to the hallway (that is open).",
    "The stove is now activated.",
)
SAMPLE_REPLY = "Thought: water boils on a hot stove, so I turn the stove on first.\nAction: activate stove"


def parse_stand_ins(pairs: list[str], flag: str = "--tokenizer-for") -> dict[str, str]:
    """`MODEL=DIR` pairs: a local folder standing in for a model that is not on disk."""
    out = {}
    for pair in pairs:
        model, sep, folder = pair.partition("=")
        if not sep or not model or not folder:
            raise InputError(f"{flag}: expected MODEL=DIR, got {pair!r}")
        if not Path(folder).is_dir():
            raise InputError(f"{flag} {pair}: {folder} is not a folder")
        out[model] = folder
    return out


def show_pieces(role: str, chat: Any, protocol: Any, budget: int) -> list[str]:
    """The sample conversation as the engine builds it, one line per turn piece."""
    pieces = [("prompt", "instruction + acknowledgement", chat.opening_ids(protocol.opening())),
              ("env", "first observation + generation prompt", chat.user_ids(SAMPLE_OBSERVATIONS[0])),
              ("reply", "a reply (sampled ids)", chat.assistant_ids(SAMPLE_REPLY)),
              ("env", "next observation + generation prompt", chat.user_ids(SAMPLE_OBSERVATIONS[1]))]
    lines = [f"{role} chat template: {'rewrites earlier turns (pieces cut before each user turn)' if chat.rewrites_history else 'appends turns as they are'}; "
             f"thinking {'on' if chat.enable_thinking else 'off'}; history {chat.history}"]
    for owner, what, ids in pieces:
        text = chat.tokenizer.decode(ids, skip_special_tokens=False)
        shown = text if len(text) <= 160 else text[:70] + " ... " + text[-80:]
        lines.append(f"  [{owner:<7} {len(ids):>5} ids] {what}: {shown!r}")
    first = len(pieces[0][2]) + len(pieces[1][2])
    lines.append(f"  the first prompt is {first} ids; the engine allows {budget} before a reply")
    if first > budget:
        raise InputError(f"{role}_engine.context_tokens: the instruction and a first observation take "
                         f"{first} ids, more than the {budget} left for a prompt (context_tokens minus "
                         "max_new_tokens)")
    return lines


def plan_nodes(cfg: TrainConfig, args: Any, described: list[Any] | None) -> tuple[list[Any], bool]:
    """The nodes to plan on, and whether on their total resources: the `described` ones (from
    --node), else the cluster's (joined here)."""
    from rose_ray.placement import cluster_nodes

    if described is not None:
        return described, True
    from rose_ray.rollout.actors import init_ray

    init_ray(args.address or cfg.ray_address)
    return cluster_nodes(), args.total


def check_served_engines(cfg: TrainConfig) -> list[str]:
    """Each served engine (openai) asked whether it can do its job (model name, context,
    logprobs, prompt scoring for OPD's teacher); an InputError names the key."""
    from rose_ray.inference.openai import SettingNames, check_served, check_served_urls
    from rose_ray.provision.tiny import resolve_tiny

    out = []
    if any(engine.spec.served for _, engine in cfg.engines()):
        import ray

        from rose_ray.rollout.actors import init_ray

        address = cfg.ray_address or os.environ.get("RAY_ADDRESS")  # "local": this machine alone
        if ray.is_initialized() or (bool(address) and address != "local"):  # a cluster, joined or to be
            init_ray(cfg.ray_address)  # the run's cluster: a loopback URL reaches one node only
            check_served_urls(cfg.engines(), sum(bool(n.get("Alive")) for n in ray.nodes()))
    for role, engine in cfg.engines():
        if not engine.spec.served:
            continue
        scores = role == "teacher" and cfg.algorithm.teacher_scores_student()
        config = replace(engine, model=resolve_tiny(engine.model, cfg.tiny_dir))  # served under its folder's name
        served = check_served(config, SettingNames.of_section(f"{role}_engine"), scores)
        longest = cfg.student_engine.context_tokens  # the teacher scores whole episodes, up to this
        if scores and served.max_model_len is not None and served.max_model_len <= longest:
            raise InputError(f"student_engine.context_tokens: the teacher scores episodes of up to {longest} tokens, "
                             f"and a server scores a sequence as a prompt with one token to generate: "
                             f"{served.name!r} at {served.url} needs max_model_len {longest + 1} or more, it has "
                             f"{served.max_model_len} (serve it with --max-model-len {longest + 1}, or lower "
                             "student_engine.context_tokens)")
        out.append(f"{role} engine: {served}")
    return out


def check(cfg: TrainConfig, args: Any) -> list[str]:
    """Every check, in order; returns the report lines or raises naming the first problem."""
    from rose_ray.chat import ChatFormat, ChatTemplateError
    from rose_ray.envs.worlds import get_world
    from rose_ray.models import load_tokenizer, model_folder
    from rose_ray.rollout.context import ContextSettings
    from rose_ray.rollout.episode import same_tokenizer

    stand_ins = parse_stand_ins(args.tokenizer_for or [])
    config_for = parse_stand_ins(args.model_config_for or [], "--model-config-for")
    described = parse_nodes(args.node) if args.node else None
    out = [f"config {cfg.name!r}: algorithm {cfg.algorithm.describe()}, {cfg.mode}, {cfg.steps} steps, "
           f"world {cfg.env.world}"]
    protocol = cfg.env.protocol()
    if cfg.env.instruction_from:
        out.append(f"instruction and acknowledgement from {cfg.env.instruction_from}")

    # Engine backends (a remote node's are checked when its engine starts).
    for role, engine in cfg.engines():
        problem = backend_problem(engine.backend.name, import_it=True)
        if problem is not None:
            raise InputError(f"{role}_engine.backend: {problem}")
        out.append(f"{role} engine: backend {engine.backend.name}")
    out += check_served_engines(cfg)

    # Tokenizers and chat templates.
    toks = {}
    for role, engine in cfg.engines():
        name = engine.tokenizer or engine.model
        if (path := model_folder(name, cfg.tiny_dir, stand_ins)) is None:
            raise InputError(f"{role}_engine.model: {name!r} is not on this machine; pass "
                             f"--tokenizer-for {name}=DIR with a folder holding its tokenizer")
        toks[role] = load_tokenizer(path)
        try:
            chat = ChatFormat(toks[role], cfg.chat.enable_thinking, cfg.chat.history)
        except ChatTemplateError as e:
            raise InputError(f"{role}_engine.model: {name}: its chat template cannot be used: {e}") from None
        sampling = cfg.rollout.student_sampling if role == "student" else cfg.rollout.teacher_sampling
        out.append(f"{role}: {name} (tokenizer from {path}, {len(toks[role])} tokens)")
        out += show_pieces(role, chat, protocol, ContextSettings.of(engine).budget(sampling.max_new_tokens))
    if cfg.teacher.expert:
        out.append("teacher: the world's expert (teacher.kind=expert): its replies are text, tokenized with the "
                   "student's tokenizer")
    else:
        shared = same_tokenizer(toks["student"], toks["teacher"])
        out.append(f"student and teacher {'share one tokenizer' if shared else 'have different tokenizers'}")
        cfg.algorithm.check_agents(cfg, shared)

    # Games.
    catalogue = get_world(cfg.env.world).catalogue(cfg.env.mapping)
    splits = {"rollout.split": cfg.rollout.split, "eval.split": cfg.eval.split}
    splits |= {f"{role}_warmup (rollout.split)": cfg.rollout.split for role in ("teacher", "student")
               if getattr(cfg, f"{role}_warmup").enabled}
    chosen = {}
    for key, split in splits.items():
        try:
            games = catalogue.split(split)
        except (KeyError, ValueError) as e:
            raise InputError(f"{key}: {e.args[0] if e.args else e}") from None
        if cfg.tasks:
            games = [g for g in games if g.task in cfg.tasks]
        if not games:
            raise InputError(f"{key}: {split!r} holds no games{' of tasks ' + str(cfg.tasks) if cfg.tasks else ''}")
        chosen[key] = {g.item_id for g in games}
        evaluated = f", {min(len(games), cfg.eval.n)} evaluated" if key == "eval.split" else ""
        out.append(f"{key}: {split!r} under mapping {catalogue.mapping!r}: {len(games)} games{evaluated}")
    if overlap := chosen["rollout.split"] & chosen["eval.split"]:
        raise InputError(f"eval.split: {len(overlap)} of its games are also training games "
                         f"(e.g. {sorted(overlap)[0]}); the eval would not be held out")

    # Placement.
    nodes, use_total = plan_nodes(cfg, args, described)
    where = f"{len(nodes)} described node(s)" if args.node else "the connected cluster"
    placed = check_cluster(cfg, use_total=use_total, nodes=nodes)
    out.append(f"placement on {where}: {len(demands(cfg))} roles fit")
    out += [("  " + line).rstrip() for line in format_plan(placed, nodes, use_total=use_total).splitlines()]

    # Memory per GPU.
    gib, source = gpu_memory(args.gpu_memory, nodes)
    memory = memory_plan(cfg, gib, config_for)
    check_memory(memory)
    out += format_memory(memory, source)
    return out


def check_main(args: Any) -> int:
    if args.backends:
        print("\n".join(f"check: backend {line}" for line in backends_report()))
        # a driver that cannot run the wheels: exit 2
        print("\n".join(f"check: {line}" for line in gpu_report()))
        return 0
    if args.overrides and "=" not in args.overrides[0]:  # `check CONFIG`, the spelling before --config
        if args.config:
            raise InputError(f"check: {args.overrides[0]!r}: not KEY=VALUE (the config is --config {args.config})")
        args.config, args.overrides = args.overrides[0], args.overrides[1:]
    cfg = load_config(args.config, args.overrides)
    print("\n".join(check(cfg, args)))
    print("\n".join(gpu_report()))  # this machine's GPUs, when the check runs on a GPU node
    print(f"check: {args.config or default_config_path()}: OK")
    return 0


def plan_main(args: Any) -> int:
    """`rose-ray plan`: where each actor would go and each role's memory per GPU; exit 2
    (PlacementError) when the cluster cannot hold it or a role cannot fit its GPUs."""
    cfg = load_config(args.config, args.overrides)
    nodes, use_total = plan_nodes(cfg, args, parse_nodes(args.node) if args.node else None)
    print("\n".join(describe_demands(cfg, nodes, described=bool(args.node))))
    placed = check_cluster(cfg, use_total=use_total, nodes=nodes)
    print()
    print(format_plan(placed, nodes, use_total=use_total))
    gib, source = gpu_memory(args.gpu_memory, nodes)
    memory = memory_plan(cfg, gib, parse_stand_ins(args.model_config_for or [], "--model-config-for"))
    print()
    print("\n".join(format_memory(memory, source)))
    check_memory(memory)
    print(f"\nplan: the cluster can hold {cfg.name!r} ({len(placed)} units on {len({a.node.node_id for a in placed})} node(s))"
          + ("" if gib is None else "; every role fits its GPUs"))
    return 0
