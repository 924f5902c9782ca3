"""The trained student as a Hugging Face folder, from any kept checkpoint:
`rose-ray export RUN [--step N] --out DIR` (RUN: a run folder, or a run_dir: its latest run).
DeepSpeed checkpoints are per rank and ZeRO stage, so a learner group built from the run's own
config.yaml (on CPUs where there is no GPU) loads one and exports it as a run does;
`rose_ray_model.json` names where it came from.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

from rose_ray.checkpoint import Checkpoint, load_learner, read_checkpoint
from rose_ray.config import TrainConfig, load_config
from rose_ray.runs import resolve_run

MODEL_INFO = "rose_ray_model.json"


def model_info(cfg: TrainConfig, run_dir: str | Path, step: int, version: int, base: str) -> str:
    """The provenance file of an exported model: which run, step and policy version."""
    return json.dumps({
        "run_dir": str(Path(run_dir).resolve()), "step": step, "policy_version": version,
        "algorithm": cfg.algorithm.name, "base_model": cfg.student_engine.model, "base_path": base,
    }, indent=1) + "\n"


def check_request(run_dir: str | Path, out: str | Path, step: int | None) -> tuple[TrainConfig, Checkpoint]:
    """The config of a run folder and the checkpoint to export; every problem is an InputError
    raised before anything starts or is written."""
    from rose_ray.learner.export import check_model_out

    record = read_checkpoint(run_dir, step)
    check_model_out(out, overwrite=False, offers_overwrite=False)
    return load_config(Path(run_dir) / "config.yaml"), record


def export_run(run_dir: str | Path, out: str | Path, step: int | None = None) -> dict[str, Any]:
    """Load step `step` (default: the latest kept) of a run (a run_dir: its latest) into a
    learner group and export it."""
    import ray

    from rose_ray.files import out_path
    from rose_ray.learner.learner import LearnerGroup
    from rose_ray.placement import check_shared_storage
    from rose_ray.provision.tiny import resolve_tiny
    from rose_ray.rollout.actors import init_ray

    run_dir = resolve_run(run_dir)
    out = out_path(out)  # on the driver: learner rank 0 writes it, from its own node and working directory
    cfg, record = check_request(run_dir, out, step)
    base = resolve_tiny(cfg.student_engine.model, cfg.tiny_dir)  # the weights are the checkpoint's
    started = init_ray(None)  # RAY_ADDRESS, else a private local cluster
    try:
        for line in check_shared_storage({"--out": out.parent}, "export"):  # rank 0 may be on another node
            print(line, flush=True)
        # The run's ranks, ZeRO stage and dtype, on what this cluster has (a laptop too).
        lc = cfg.learner
        total = ray.cluster_resources()
        gpus = lc.gpus_per_rank if total.get("GPU", 0.0) >= lc.gpus_per_rank * lc.ranks else 0.0
        cpus = min(lc.cpus_per_rank, max(total.get("CPU", 1.0) / lc.ranks, 0.01))
        learner = replace(lc, model=base, cpus_per_rank=cpus, gpus_per_rank=gpus,
                          backend=lc.backend if gpus else "auto")
        group = LearnerGroup(learner)
        try:
            state = load_learner(group, run_dir, record.tag, "export")
            info = model_info(cfg, run_dir, state["step"], state["version"], base)
            result = group.export(out, {MODEL_INFO: info})
        finally:
            group.shutdown()
    finally:
        if started:
            ray.shutdown()
    return {**result, "run": str(run_dir), "step": int(state["step"]), "version": int(state["version"])}


def cli_main(args: Any) -> int:
    result = export_run(args.run, args.out, args.step)
    print(f"export: step {result['step']} (policy version {result['version']}) of {result['run']} -> "
          f"{result['path']} ({result['tensors']} tensors, {result['mb']:.1f} MB, {result['dtype']})")
    print(f"export: try it with  rose-ray eval --model {result['path']}")
    return 0
