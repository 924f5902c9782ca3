"""The `env:` section of a run's config, checked when it loads (errors name the key)."""

from __future__ import annotations

from dataclasses import dataclass, field

from rose_ray.errors import ConfigError, InputError, at_least

DEFAULT_HEAP = "256m"  # ScienceWorld's JVM heap cap (-Xmx); 128m runs out of memory generating gold paths


@dataclass
class EnvConfig:
    workers: int = 1  # EnvPool actors
    games_per_worker: int = 4  # game processes (JVMs, workers) per actor
    heap: str = DEFAULT_HEAP  # a JVM's heap cap (ScienceWorld); "": uncapped
    call_timeout_s: float = 60.0  # a game call (load, step) that takes longer is a hung game: killed and replaced
    cpus_per_worker: float = 1.0  # Ray CPUs of each EnvPool actor
    resources: dict[str, float] = field(default_factory=dict)  # e.g. {"env_node": 0.01}
    world: str = "sciworld"  # sciworld or discoveryworld
    mapping: str | None = None  # the world's catalogue mapping (None: its default)
    # A JSONL dataset whose first row's first two messages become the instruction and its
    # acknowledgement (exact compatibility with existing data); None: the world's own wording.
    instruction_from: str | None = None

    def __post_init__(self) -> None:
        at_least(self, "env.", 1, "workers", "games_per_worker")
        at_least(self, "env.", 0, "call_timeout_s", above=True)
        from rose_ray.envs.worlds import WORLDS, get_world

        if self.world not in WORLDS:
            raise ConfigError(f"env.world: must be one of {sorted(WORLDS)}, got {self.world!r}")
        try:
            get_world(self.world).catalogue(self.mapping)
        except InputError as e:
            raise ConfigError(f"env.mapping: {e}") from None
        if self.instruction_from:
            self.protocol()  # an unreadable file fails at load, naming the key

    def protocol(self):
        """The world's protocol, with the instruction of `instruction_from` when set."""
        from rose_ray.envs.worlds import world_protocol

        try:
            return world_protocol(self.world, self.instruction_from)
        except InputError as e:
            raise ConfigError(f"env.instruction_from: {e}") from None
