"""What each role asks of the cluster, and an early, clear failure when it cannot fit.

Without this check an actor that cannot be placed waits forever; with it the run stops at
start with the role and the missing resource named.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass
class RoleDemand:
    role: str
    replicas: int
    per_replica: dict[str, float]

    def total(self) -> dict[str, float]:
        return {k: v * self.replicas for k, v in self.per_replica.items() if v}


def demands(cfg: Any) -> list[RoleDemand]:
    """Per role of a TrainConfig: replica count and resources per replica."""
    env = {"CPU": cfg.env.cpus_per_worker, **cfg.env.resources}
    r = cfg.resources
    return [
        RoleDemand("env workers", cfg.env.workers, env),
        RoleDemand("eval env worker", 1, env),
        RoleDemand("student engine", 1, {"CPU": r.student_cpus, "GPU": r.student_gpus}),
        RoleDemand("teacher engine", 1, {"CPU": r.teacher_cpus, "GPU": r.teacher_gpus}),
        RoleDemand("learner", cfg.learner.ranks,
                   {"CPU": cfg.learner.cpus_per_rank, "GPU": cfg.learner.gpus_per_rank}),
    ]


def check_fits(roles: list[RoleDemand], available: dict[str, float]) -> None:
    """Raise ValueError naming the first role whose resources run out (roles taken in order)."""
    left = dict(available)
    for d in roles:
        for key, amount in d.total().items():
            have = left.get(key, 0.0)
            if amount > have + 1e-9:
                raise ValueError(
                    f"the cluster cannot hold the {d.role} ({d.replicas} x {d.per_replica}): "
                    f"it needs {amount:g} {key} but only {have:g} of the cluster's "
                    f"{available.get(key, 0.0):g} are left after the roles before it"
                )
            left[key] = have - amount
