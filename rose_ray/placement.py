"""Where each role's actors go: demands from the config, a per-node plan (bin-packed: an actor
must fit on ONE node), placement groups for the GPU roles. Printed by `rose-ray plan`; the
manual: docs/cluster.md, "Where each actor goes"."""

from __future__ import annotations

import math
import os
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rose_ray.errors import InputError

# Resources Ray reports per node that no role asks for; left out of tables.
_HIDDEN = ("memory", "object_store_memory", "node:", "accelerator_type:")


class PlacementError(InputError):
    """The cluster cannot hold the config; the message names the role and the resource."""


@dataclass
class RoleDemand:
    role: str
    replicas: int
    per_replica: dict[str, float]
    strategy: str = "PACK"  # PACK: fill a node before the next; SPREAD: one node after another
    group: str | None = None  # GPU roles: the placement group whose bundles they use


def demands(cfg: Any) -> list[RoleDemand]:
    """Per role of a TrainConfig: replica count, resources per replica, strategy, GPU group."""
    env = {"CPU": cfg.env.cpus_per_worker, **cfg.env.resources}
    r, learner = cfg.resources, {"CPU": cfg.learner.cpus_per_rank, "GPU": cfg.learner.gpus_per_rank}
    out = [RoleDemand("env workers", cfg.env.workers, env, "SPREAD"),
           RoleDemand("eval env worker", 1, env, "SPREAD")]
    for role, engine in cfg.engines():  # the world's expert teacher has no engine to place
        gpus, split = getattr(r, f"{role}_gpus"), engine.backend.tensor_parallel
        tp = int(split.value) if split is not None else 1
        # one GPU per tensor-parallel rank; without tensor parallelism a fraction of one GPU may be shared
        if split is not None and gpus > 0 and gpus != tp and not (tp == 1 and gpus < 1):
            key = f"{role}_engine.backend.{split.key}"
            raise PlacementError(f"resources.{role}_gpus: {gpus:g}, but {key} is {tp}: the engine uses "
                                 f"one GPU per tensor-parallel rank; set resources.{role}_gpus: {tp} "
                                 f"or {key}: {gpus:g}")
        group = "learner" if role == "student" and r.colocate and learner["GPU"] > 0 else role
        out.append(RoleDemand(f"{role} engine", 1, {"CPU": getattr(r, f"{role}_cpus"), "GPU": gpus}, "PACK",
                              group if gpus > 0 else None))
    out.append(RoleDemand("learner ranks", cfg.learner.ranks, learner, "PACK",
                          "learner" if learner["GPU"] > 0 else None))
    return out


# --------------------------------------------------------------------------- bundles
@dataclass
class Unit:
    """What must land on one node: one actor, or one placement-group bundle of actors."""

    label: str  # e.g. "learner ranks #1", or "learner ranks #0 + student engine" (colocated)
    members: list[tuple[str, int]]  # (role, replica index)
    resources: dict[str, float]
    strategy: str
    group: str | None = None
    bundle: int | None = None


def units(roles: list[RoleDemand]) -> list[Unit]:
    """Actors and GPU bundles, in the order they are placed: biggest GPU units first (fewer
    stranded GPUs), then other PACK actors, then SPREAD actors (env workers)."""
    out: list[Unit] = []
    bundles: dict[str, list[Unit]] = {}
    for d in roles:
        for i in range(d.replicas):
            name = d.role if d.replicas == 1 else f"{d.role} #{i}"
            res = {k: float(v) for k, v in d.per_replica.items() if v}
            if d.group is None:
                out.append(Unit(name, [(d.role, i)], res, d.strategy))
                continue
            group = bundles.setdefault(d.group, [])
            if i < len(group):  # colocated: share the bundle of the same index
                b = group[i]
                b.label += f" + {name}"
                b.members.append((d.role, i))
                b.resources = dict(Counter(b.resources) + Counter(res))  # both positive: sums kept
            else:
                group.append(Unit(name, [(d.role, i)], res, "PACK", d.group, i))
    gpu = [b for group in bundles.values() for b in group]
    for b in gpu:  # separate GPU sets: a bundle holds whole GPUs
        b.resources["GPU"] = float(math.ceil(b.resources.get("GPU", 0.0) - 1e-9))
    return (sorted(gpu, key=lambda u: -u.resources.get("GPU", 0))
            + sorted(out, key=lambda u: u.strategy == "SPREAD"))  # stable: PACK actors, then SPREAD


# --------------------------------------------------------------------------- nodes
@dataclass
class NodeInfo:
    node_id: str
    address: str
    total: dict[str, float]
    available: dict[str, float] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return f"{self.node_id[:8]} ({self.address})"


def parse_nodes(specs: list[str]) -> list[NodeInfo]:
    """`--node CPU=64,GPU=8[,env_node=1]` (repeatable; `Nx` in front for N such nodes)."""
    nodes = []
    for spec in specs:
        count, _, body = spec.partition("x") if spec.split("x", 1)[0].isdigit() else ("1", "", spec)
        res: dict[str, float] = {}
        for item in body.split(","):
            key, sep, value = item.partition("=")
            try:
                res[key.strip()] = float(value)
            except ValueError:
                sep = ""
            if not sep or not key.strip():
                raise InputError(f"--node: expected RESOURCE=NUMBER[,...] (e.g. CPU=64,GPU=8), got {spec!r}")
        for _ in range(int(count)):
            nodes.append(NodeInfo(f"node{len(nodes)}", "described", dict(res), dict(res)))
    return nodes


def cluster_nodes() -> list[NodeInfo]:
    """Alive nodes of the connected cluster with their total and available resources."""
    import ray
    from ray._private.state import state  # per-node availability; no public API gives it

    available = state.available_resources_per_node()
    return [NodeInfo(n["NodeID"], n["NodeManagerAddress"], dict(n["Resources"]),
                     dict(available.get(n["NodeID"], {})))
            for n in ray.nodes() if n["Alive"]]


@dataclass
class Assignment:
    unit: Unit
    node: NodeInfo


def plan(roles: list[RoleDemand], nodes: list[NodeInfo], use_total: bool = False) -> list[Assignment]:
    """Bin-pack every unit onto one node, or raise PlacementError naming role and resource.
    Greedy, biggest first: PACK units go to the node holding their group, else the fullest node
    that fits; SPREAD units to the node holding fewest of their role."""
    if not nodes:
        raise PlacementError("the cluster has no alive nodes")
    left = {n.node_id: Counter(n.total if use_total else n.available) for n in nodes}
    placed: list[Assignment] = []
    for u in units(roles):
        fits = [n for n in nodes if all(left[n.node_id].get(k, 0.0) + 1e-9 >= v for k, v in u.resources.items())]
        if not fits:
            raise PlacementError(_why_not(u, nodes, left, placed, use_total))
        if u.strategy == "SPREAD":  # the node holding fewest of the role, then the most CPUs left
            held = Counter(a.node.node_id for a in placed if a.unit.members[0][0] == u.members[0][0])
            node = min(fits, key=lambda n: (held[n.node_id], -left[n.node_id].get("CPU", 0.0)))
        else:
            same = [n for n in fits if u.group and any(a.node is n and a.unit.group == u.group for a in placed)]
            node = min(same or fits, key=lambda n: (left[n.node_id].get("GPU", 0.0), left[n.node_id].get("CPU", 0.0)))
        left[node.node_id].subtract(u.resources)
        placed.append(Assignment(u, node))
    return placed


def _why_not(u: Unit, nodes: list[NodeInfo], left: dict[str, dict[str, float]],
             placed: list[Assignment], use_total: bool) -> str:
    head = f"the cluster cannot hold the {u.label} (needs {_fmt(u.resources)} on one node): "
    for key, need in u.resources.items():
        totals = [n.total.get(key, 0.0) for n in nodes]
        if max(totals) <= 0:
            return head + (f"no node has the resource {key!r} "
                           f"({len(nodes)} node(s): {'; '.join(f'{n.name}: {_fmt(_shown(n.total))}' for n in nodes)})")
        if max(totals) + 1e-9 < need:
            return head + (f"it needs {need:g} {key} on one node but the largest node has {max(totals):g} {key} "
                           f"(the cluster has {sum(totals):g} {key} in all)")
    missing = [k for k, need in u.resources.items() if all(left[n.node_id].get(k, 0.0) + 1e-9 < need for n in nodes)]
    before = sorted({role for a in placed for role, _ in a.unit.members})
    after = f" after placing {', '.join(before)}" if before else ""
    if not use_total and not placed:
        after = " (resources in use by other jobs count; --total plans on an empty cluster)"
    if missing:
        key = missing[0]
        per_node = "; ".join(f"{n.name}: {left[n.node_id].get(key, 0.0):g}" for n in nodes if n.total.get(key))
        return head + f"no node has {u.resources[key]:g} {key} left{after} ({key} left per node: {per_node})"
    per_node = "; ".join(f"{n.name}: {_fmt(_shown(left[n.node_id]))}" for n in nodes)
    return head + f"no single node has all of it left{after} (left per node: {per_node})"


def _shown(res: dict[str, float]) -> dict[str, float]:
    return {k: v for k, v in res.items() if not k.startswith(_HIDDEN)}


def _fmt(res: dict[str, float]) -> str:
    return ", ".join(f"{v:g} {k}" for k, v in sorted(res.items())) or "nothing"


def format_plan(placed: list[Assignment], nodes: list[NodeInfo], use_total: bool = False) -> str:
    """A table of units per node, then what each node has left."""
    lines = [f"{'role':<44} {'node':<28} resources"]
    for a in sorted(placed, key=lambda a: (nodes.index(a.node), a.unit.label)):
        group = f"  [placement group {a.unit.group!r}, bundle {a.unit.bundle}]" if a.unit.group else ""
        lines.append(f"{a.unit.label:<44} {a.node.name:<28} {_fmt(a.unit.resources)}{group}")
    lines.append("")
    lines.append(f"{'node':<28} {'has (' + ('total' if use_total else 'available') + ')':<40} left after the plan")
    for n in nodes:
        have = n.total if use_total else n.available
        left = Counter(have)
        left.subtract(sum((Counter(a.unit.resources) for a in placed if a.node is n), Counter()))
        lines.append(f"{n.name:<28} {_fmt(_shown(have)):<40} {_fmt(_shown(left))}")
    return "\n".join(lines)


def check_cluster(cfg: Any, use_total: bool = False, nodes: list[NodeInfo] | None = None) -> list[Assignment]:
    """Plan the config on the connected cluster; raise PlacementError when it cannot fit."""
    return plan(demands(cfg), cluster_nodes() if nodes is None else nodes, use_total=use_total)


# --------------------------------------------------------------------------- placement groups
class PlacementGroups:
    """Ray placement groups for the GPU roles, reserved all at once before any actor starts;
    `options(role, index)` puts a replica into its bundle ({} for a role without GPUs)."""

    def __init__(self, roles: list[RoleDemand], timeout_s: float = 300.0) -> None:
        from ray.util.placement_group import placement_group

        self.groups: dict[str, Any] = {}
        self.where: dict[tuple[str, int], tuple[str, int]] = {}
        by_group: dict[str, list[Unit]] = {}
        for u in units(roles):
            if u.group is not None:
                by_group.setdefault(u.group, []).append(u)
        for name, bundles in by_group.items():
            bundles.sort(key=lambda u: u.bundle)
            self.where.update({m: (name, u.bundle) for u in bundles for m in u.members})
            pg = placement_group([u.resources for u in bundles], strategy="PACK", name=f"rose_ray_{name}")
            self.groups[name] = pg
            if not pg.wait(timeout_seconds=timeout_s):
                self.remove()
                need = " + ".join(_fmt(u.resources) for u in bundles)
                raise PlacementError(f"placement group {name!r} ({need}) was not ready after {timeout_s:g} s: "
                                     f"the cluster cannot hold the GPUs of {bundles[0].label} "
                                     f"(run `rose-ray plan` to see why)")

    def options(self, role: str, index: int = 0) -> dict[str, Any]:
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        if (role, index) not in self.where:
            return {}
        name, bundle = self.where[(role, index)]
        return {"scheduling_strategy": PlacementGroupSchedulingStrategy(
            self.groups[name], placement_group_bundle_index=bundle,
            placement_group_capture_child_tasks=True)}

    def remove(self) -> None:
        from ray.util.placement_group import remove_placement_group

        for pg in self.groups.values():
            remove_placement_group(pg)
        self.groups.clear()


def describe_demands(cfg: Any, nodes: list[NodeInfo], described: bool) -> list[str]:
    """The nodes' totals, then each role's replicas and resources per replica (`rose-ray plan`)."""
    totals: Counter[str] = Counter()
    for n in nodes:
        totals.update(_shown(n.total))
    return [f"{'described' if described else 'cluster'}: {len(nodes)} node(s), {_fmt(totals)}"] + [
        f"  {d.role:<16} {d.replicas} x {_fmt({k: v for k, v in d.per_replica.items() if v})}"
        f"  {d.strategy}{'  group ' + d.group if d.group else ''}" for d in demands(cfg)]


SHARED_MARKER = ".rose_ray_shared"


def check_shared_storage(paths: dict[str, Path], command: str = "train") -> list[str]:
    """On more than one node, each path (config key or flag -> folder) must be the same folder
    on every node (the learner writes on its node, engines load on theirs): the driver writes a
    marker with a fresh token, a task on every node reads it back. An InputError names the key
    and the nodes that do not see it. Returns a line per path checked (none on one node)."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    nodes = [n for n in ray.nodes() if n.get("Alive")]
    if len(nodes) < 2:
        return []

    @ray.remote(num_cpus=0)
    def read(marker: str) -> str | None:
        try:
            return Path(marker).read_text()
        except OSError:
            return None

    lines = []
    for key, folder in paths.items():
        folder = Path(folder).expanduser().resolve()
        folder.mkdir(parents=True, exist_ok=True)
        token = os.urandom(8).hex()
        marker = folder / f"{SHARED_MARKER}.{token}"
        marker.write_text(token)
        try:
            refs = {n["NodeManagerAddress"] + " " + n["NodeID"][:8]: read.options(
                scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False)).remote(str(marker))
                for n in nodes}
            seen = dict(zip(refs, ray.get(list(refs.values()), timeout=120)))
        finally:
            marker.unlink(missing_ok=True)
        blind = [node for node, text in seen.items() if text != token]
        if blind:
            raise InputError(f"{key}: {folder} is not shared storage: node(s) {', '.join(blind)} do not see what "
                             "the driver wrote there; put it on a path every node mounts (ROSE_RAY_RUNS / run_dir "
                             "for runs, ROSE_RAY_CACHE / tiny_dir for tiny models and caches, HF_HOME for models "
                             "named by hub id)")
        lines.append(f"{command}: {key} {folder}: seen by all {len(nodes)} nodes")
    return lines
