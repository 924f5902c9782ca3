"""Offline SFT: `rose-ray sft --data FILE.jsonl --model M --out DIR`.

Rows in the AgentGym conversation schema are rendered through the student's chat template
and trained with the same DeepSpeed learner group the online loop uses (algorithm "sft":
cross entropy on the chosen owners' tokens). The result is a Hugging Face folder in DIR, with
the per-step log in DIR/sft_log.jsonl.
"""

from __future__ import annotations

import json
import math
import os
import random
from pathlib import Path
from typing import Any


def train_sft(
    data: str | Path,
    model: str,
    out: str | Path,
    epochs: int = 1,
    batch_size: int = 8,
    log: Any = print,
    **learner: Any,
) -> dict[str, Any]:
    """Train on every row `epochs` times in shuffled batches of `batch_size` rows, export to
    `out`. `learner` holds LearnerConfig fields (lr, ranks, zero_stage, dtype, ...)."""
    import ray

    from rose_ray.chat import ChatFormat
    from rose_ray.data import read_jsonl, row_to_trajectory
    from rose_ray.learner.batching import render
    from rose_ray.learner.learner import LearnerConfig, LearnerGroup
    from rose_ray.models import load_tokenizer

    if epochs < 1:
        raise ValueError(f"sft.epochs: must be >= 1, got {epochs!r}")
    if batch_size < 1:
        raise ValueError(f"sft.batch_size: must be >= 1, got {batch_size!r}")
    rows = read_jsonl(data)  # bad data fails here, before any actor starts
    steps = epochs * math.ceil(len(rows) / batch_size)
    if learner.get("schedule", "constant") != "constant":
        learner.setdefault("total_steps", steps)
    config = LearnerConfig(model=str(model), algorithm="sft", **learner)
    tokenizer = load_tokenizer(model)
    fmt = ChatFormat(tokenizer)
    seqs = [render(row_to_trajectory(r), fmt, config.max_tokens, config.context_policy) for r in rows]
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else fmt.eos_id

    started_ray = not ray.is_initialized()
    if started_ray:
        os.environ.setdefault("RAY_AUTH_MODE", "disabled")
        # RAY_ADDRESS (a submitted job), else a private local cluster: never another user's
        # `ray start` cluster that happens to run on this machine.
        ray.init(address=None if os.environ.get("RAY_ADDRESS") else "local",
                 include_dashboard=False, log_to_driver=False)
    group = LearnerGroup(config)
    history = []
    try:
        rng = random.Random(config.seed)
        for epoch in range(epochs):
            order = list(range(len(seqs)))
            rng.shuffle(order)
            for at in range(0, len(order), batch_size):
                batch = group.make_batch([seqs[i] for i in order[at : at + batch_size]], pad_id)
                metrics = group.train_step(batch)
                metrics["epoch"] = float(epoch)
                history.append(metrics)
                log(f"step {int(metrics['step'])}/{steps} epoch {epoch} loss {metrics['loss']:.4f} "
                    f"grad_norm {metrics['grad_norm']:.3f} lr {metrics['lr']:.2e} "
                    f"tokens/s {metrics['tokens_per_s']:.0f}")
        exported = group.export(out)
    finally:
        group.shutdown()
        if started_ray:
            ray.shutdown()
    with open(Path(out) / "sft_log.jsonl", "w", encoding="utf-8") as f:
        for m in history:
            f.write(json.dumps(m) + "\n")
    return {"rows": len(rows), "steps": len(history), "history": history, "export": exported}


def cli_main(args: Any) -> int:
    """The `sft` subcommand (arguments in rose_ray/cli.py)."""
    learner = {
        "lr": args.lr, "ranks": args.ranks, "zero_stage": args.zero_stage, "dtype": args.dtype,
        "max_tokens": args.max_tokens, "grad_accum": args.grad_accum, "seed": args.seed,
        "threads": args.threads, "sft_owners": args.owners.split(","),
        "schedule": args.schedule, "warmup_steps": args.warmup_steps,
    }
    result = train_sft(args.data, args.model, args.out, epochs=args.epochs,
                       batch_size=args.batch_size, **learner)
    last = result["history"][-1]["loss"] if result["history"] else float("nan")
    print(f"sft: {result['rows']} rows, {result['steps']} steps, final loss {last:.4f}; "
          f"model in {result['export']['path']}")
    return 0
