"""Offline SFT: `rose-ray sft --data FILE.jsonl --model M --out DIR`.

Rows (the dataset card's schema or AgentGym's) are rendered through the student's chat template
and trained by the online loop's learner group: cross entropy on the chosen owners' tokens. A row
longer than `max_tokens` is cut as an engine's drop_oldest would. The result is a Hugging Face
folder in DIR with DIR/sft_log.jsonl; `--overwrite` replaces only a model folder rose-ray wrote.
"""
from __future__ import annotations

import json
import math
import random
from itertools import accumulate
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

from rose_ray.errors import InputError, at_least

if TYPE_CHECKING:
    from rose_ray.commands import SftCommand


def train_sft(
    data: str | Path,
    model: str,
    out: str | Path,
    epochs: int = 1,
    batch_size: int = 8,
    log: Any = print,
    history: str = "sampled",
    sft_owners: list[str] | tuple[str, ...] = ("student", "teacher"),
    overwrite: bool = False,
    **learner: Any,
) -> dict[str, Any]:
    """Train on every row `epochs` times in shuffled batches of `batch_size` rows, export to
    `out` (checked first). `learner`: LearnerConfig fields. `history`: `sampled` (per-turn
    pieces, as an engine builds them) or `template` (each conversation as the template renders
    it). `sft_owners`: whose tokens are imitated."""
    import ray

    from rose_ray.chat import ChatFormat
    from rose_ray.files import out_path
    from rose_ray.learner.export import check_model_out
    from rose_ray.learner.learner import LearnerConfig, LearnerGroup
    from rose_ray.models import load_tokenizer
    from rose_ray.placement import check_shared_storage
    from rose_ray.recipes.teacher_sft import imitate
    from rose_ray.rollout.actors import init_ray
    from rose_ray.rows import read_jsonl, row_to_trajectory
    from rose_ray.tokens import make_batch, render, with_ids

    at_least(SimpleNamespace(epochs=epochs, batch_size=batch_size), "sft.", 1, "epochs", "batch_size")
    weights = imitate(sft_owners, "sft.owners")
    out = out_path(out)  # on the driver: learner rank 0 writes it, from its own node and working directory
    check_model_out(out, overwrite)
    rows = read_jsonl(data)  # bad data fails here, before any actor starts
    steps = epochs * math.ceil(len(rows) / batch_size)
    if learner.get("schedule", "constant") != "constant":
        learner.setdefault("total_steps", steps)
    config = LearnerConfig(model=str(model), **learner)
    tokenizer = load_tokenizer(model)
    fmt = ChatFormat(tokenizer, history=history)
    seqs = []
    for n, row in enumerate(rows, 1):
        turns = row_to_trajectory(row).turns
        try:
            turns = with_ids(turns, fmt)  # tokenized once, for the cut and the sequence
            seqs.append(render(turns, cut=row_cut(turns, config.max_tokens)))
        except ValueError as e:
            raise InputError(f"{data}:{n}: {e}") from None
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else fmt.eos_id

    # RAY_ADDRESS (a submitted job), else a private local cluster with its own token; a Ray up already stays.
    started_ray = init_ray(None)
    group, history = None, []
    try:
        for line in check_shared_storage({"--out": out.parent}, "sft"):  # rank 0 may be on another node
            print(line, flush=True)
        group = LearnerGroup(config)
        rng = random.Random(config.seed)
        for epoch in range(epochs):
            order = list(range(len(seqs)))
            rng.shuffle(order)
            for at in range(0, len(order), batch_size):
                batch = make_batch([seqs[i] for i in order[at : at + batch_size]], weights, config.max_tokens, pad_id)
                metrics = group.train_step(batch)
                metrics["epoch"] = float(epoch)
                history.append(metrics)
                log(f"step {int(metrics['step'])}/{steps} epoch {epoch} loss {metrics['loss']:.4f} "
                    f"grad_norm {metrics['grad_norm']:.3f} lr {metrics['lr']:.2e} "
                    f"tokens/s {metrics['tokens_per_s']:.0f}")
        # The log goes in with the weights: the folder appears whole or not at all.
        exported = group.export(out, {"sft_log.jsonl": "".join(json.dumps(m) + "\n" for m in history)})
    finally:
        if group is not None:
            group.shutdown()
        if started_ray:
            ray.shutdown()
    return {"rows": len(rows), "steps": len(history), "history": history, "export": exported}


def row_cut(turns: list[Any], max_tokens: int) -> list[int]:
    """The turns to leave out so that a row fits `max_tokens`: the oldest pairs (drop_oldest),
    else everything after the longest prefix that fits; InputError if no trained turn is left."""
    from rose_ray.rollout.context import ContextExceeded, ContextSettings

    try:  # the rollout's cut (keep_first_turns 1)
        cut = ContextSettings(max_tokens, "drop_oldest").cut(turns)
    except ContextExceeded:
        fits = sum(total <= max_tokens for total in accumulate(len(t.token_ids) for t in turns))
        cut = list(range(fits, len(turns)))
    if not any(t.role == "assistant" and t.owner != "prompt" for n, t in enumerate(turns) if n not in cut):
        raise InputError(f"the row cannot be cut to max_tokens={max_tokens} and keep a trained turn")
    return cut


def cli_main(args: SftCommand) -> int:
    """The `sft` subcommand (its settings: rose_ray/commands.py)."""
    learner = {k: getattr(args, k) for k in ("lr", "ranks", "zero_stage", "dtype", "max_tokens", "seed", "threads",
                                             "schedule", "warmup_steps")}
    result = train_sft(args.data, args.model, args.out, epochs=args.epochs, batch_size=args.batch_size,
                       history=args.history, sft_owners=args.owners.split(","), overwrite=args.overwrite,
                       **learner)
    last = result["history"][-1]["loss"] if result["history"] else float("nan")
    print(f"sft: {result['rows']} rows, {result['steps']} steps, final loss {last:.4f}; "
          f"model in {result['export']['path']}")
    return 0
