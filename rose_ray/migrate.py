"""Configs written by earlier versions of rose_ray. The loader refuses a key that moved or went,
naming where it lives now (`old_keys`); `rose-ray migrate RUN [KEY=VALUE ...]` rewrites a run's
config.yaml once in today's keys (`migrated`), keeping the old one as config.yaml.old.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Mapping
from typing import Any

from omegaconf import OmegaConf

from rose_ray.errors import InputError
from rose_ray.inference.registry import BACKENDS, settings_owner

MOVED = {  # the old key: (where it lives now, an example)
    "rollout.handoff": ("algorithm.handoff", "rose's turn policy: algorithm: {name: rose, handoff: {policy: fixed, k: 5}}"),
    "learner.lam": ("algorithm.lam", "rose's OPD weight: algorithm: {name: rose, lam: 0.5}"),
    "learner.sft_owners": ("algorithm.owners", "algorithm: {name: teacher_sft, owners: [teacher]}"),
}
REMOVED = {
    "learner.algorithm": "set `algorithm` only (rose, opd or teacher_sft); its recipe chooses the learner's loss",
    "learner.context_policy": "the learner cuts a trajectory where the engine cut it (student_engine.context_policy)",
    "learner.grad_accum": "micro-batches follow a token budget (learner.max_tokens each); their number follows from the batch",
    "learner.gradient_checkpointing": "use learner.activation_checkpointing: full | selective | none (true was full)",
    "publish.object_store_bucket_mb": "one bucket size for every method: publish.bucket_mb (MB, 0: no buckets)",
}
ENGINES = ("student_engine", "teacher_engine")


def old_keys(layer: Any) -> list[tuple[str, str]]:
    """The keys of a config layer that only an earlier version wrote, each with what to write now."""
    if not isinstance(layer, Mapping):
        return []
    conf = layer if OmegaConf.is_config(layer) else OmegaConf.create(layer)
    said = {**{key: f"moved to {new} ({example})" for key, (new, example) in MOVED.items()}, **REMOVED}
    found = [(key, f"removed; {why}") for key, why in said.items()
             if OmegaConf.select(conf, key, default=None) is not None]
    for role in ENGINES:
        section = layer.get(role)
        for key in section if isinstance(section, Mapping) else ():
            if (owner := BACKENDS.get(key) or settings_owner(key)) is not None:
                found.append((f"{role}.{key}", f"the {owner.name} backend's settings live in {role}.backend now: "
                                               f"{{name: {owner.name}, ...}}"))
    return found


def migrated(raw: dict[str, Any]) -> dict[str, Any]:
    """A config mapping an earlier version wrote, in today's keys: moved settings where the recipe
    has them, removed ones dropped, and each engine's backend settings in its `backend` section
    (other backends' dropped: they were unused)."""
    from rose_ray.recipes import recipes

    cfg = copy.deepcopy(raw)
    algorithm = cfg.get("algorithm") or "rose"
    algorithm = {"name": algorithm} if isinstance(algorithm, str) else algorithm
    recipe = recipes().get(algorithm.get("name"))
    keys = {f.name for f in dataclasses.fields(recipe)} if recipe else set()
    for key, (new, _) in MOVED.items():
        value, leaf = _pop(cfg, key), new.split(".")[1]
        if value is not None and leaf in keys:
            cfg["algorithm"] = algorithm
            algorithm.setdefault(leaf, value)
    checkpointing = _pop(cfg, "learner.gradient_checkpointing")
    if checkpointing is not None:
        cfg["learner"].setdefault("activation_checkpointing", "full" if checkpointing else "none")
    for key in REMOVED:
        _pop(cfg, key)
    for role in ENGINES:
        engine = cfg.get(role)
        if not isinstance(engine, dict) or isinstance(engine.get("backend"), dict):
            continue
        name = engine.get("backend", "hf")
        section = {"name": name, **(engine.get(name) or {})}
        for key in list(engine):
            if (owner := BACKENDS.get(key) or settings_owner(key)) is not None:
                value = engine.pop(key)
                if key != name and owner.name == name:
                    section.setdefault(key, value)
        engine["backend"] = section
    return cfg


def _pop(cfg: dict[str, Any], key: str) -> Any:
    section, leaf = key.split(".")
    return cfg[section].pop(leaf, None) if isinstance(cfg.get(section), dict) else None


def cli_main(args: Any) -> int:
    """`rose-ray migrate`: nothing is written unless the whole new config loads."""
    import yaml

    from rose_ray.config import config_of
    from rose_ray.files import write_file
    from rose_ray.runs import resolve_run, saved_config

    path = resolve_run(args.run) / "config.yaml"
    raw = yaml.safe_load(path.read_text())
    if not isinstance(raw, dict):
        raise InputError(f"{path}: not a config (a YAML mapping)")
    if not old_keys(raw) and not args.overrides:
        print(f"migrate: {path} is in today's keys; nothing to do")
        return 0
    cfg = config_of([OmegaConf.create(migrated(raw))], args.overrides, path)
    old = path.with_name("config.yaml.old")
    if old.exists():
        raise InputError(f"{old} exists (an earlier migration's); move it away to migrate {path} again")
    write_file(old, path.read_text())
    write_file(path, saved_config(cfg))
    print(f"migrate: {path} rewritten in today's keys (the old one: {old})")
    return 0
