"""The Ray actors of a run, started and ended: Ray itself, EnvPools and the student's and
teacher's engine actors (`Agent`s)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import secrets
from typing import Any

from rose_ray.envs.config import EnvConfig
from rose_ray.errors import InputError
from rose_ray.rollout.agent import EXPERT, Agent, expert_agent
from rose_ray.rollout.context import ContextSettings
from rose_ray.rollout.episode import same_tokenizer


def start_env_pools(config: EnvConfig, max_turns: int | None = None) -> list[Any]:
    """One EnvPool actor per worker, spread over nodes; Ray restarts a pool that dies."""
    from rose_ray.envs.pool import env_pool_actor

    return [
        env_pool_actor(
            num_games=config.games_per_worker,
            num_cpus=config.cpus_per_worker,
            resources=dict(config.resources),
            heap=config.heap or None,
            call_timeout_s=config.call_timeout_s,
            max_turns=max_turns,
            mapping=config.mapping,
            world=config.world,
        )
        for _ in range(config.workers)
    ]


# The first Ray whose `ray.init()` turns token auth on for a new local cluster by itself (on
# older ones the token `private_token` sets enables nothing); pyproject.toml's floor too.
RAY_TOKEN_AUTH_FLOOR = (2, 59)


def check_ray_version() -> None:
    """An InputError (exit 2) naming the installed Ray when it is older than the token-auth floor,
    unless RAY_AUTH_MODE=disabled says that running without auth is meant."""
    import ray

    if os.environ.get("RAY_AUTH_MODE", "").lower() == "disabled":
        return
    installed = tuple(int(n) for n in re.findall(r"\d+", ray.__version__)[:2])
    if installed < RAY_TOKEN_AUTH_FLOOR:
        floor = ".".join(map(str, RAY_TOKEN_AUTH_FLOOR))
        raise InputError(
            f"ray {ray.__version__} is installed; rose_ray needs ray >= {floor}, the first that turns on "
            "token authentication for the cluster it starts (without it anyone who reaches this machine's "
            f"Ray ports runs code as you): install it (pip install 'ray[default]>={floor}', or launch/setup.sh), "
            "or set RAY_AUTH_MODE=disabled to run without authentication on purpose")


def init_ray(address: str | None = None) -> bool:
    """Join `address` (or RAY_ADDRESS), else start a private local cluster (`private_token`);
    `auto` joins a cluster started with `ray start` on this machine. False: Ray was up already."""
    import ray

    check_ray_version()
    if ray.is_initialized():
        return False
    if address is None and not os.environ.get("RAY_ADDRESS"):
        address = "local"
    if address == "local":
        private_token()
    # Workers' output (vLLM, NCCL, DeepSpeed, the env JVMs) reaches the job's log.
    ray.init(address=address, include_dashboard=False, log_to_driver=True)
    return True


def private_token() -> None:
    """A fresh token for the local cluster this process starts, only in its environment (Ray's own
    would go to ~/.ray/auth_token with the umask's permissions). A token the user gave
    (RAY_AUTH_TOKEN, or RAY_AUTH_TOKEN_PATH unless others can read it) and RAY_AUTH_MODE=disabled are kept."""
    mode = (os.environ.get("RAY_AUTH_MODE") or "").lower()
    if mode == "disabled":
        logging.getLogger(__name__).warning(
            "RAY_AUTH_MODE=disabled: this local Ray cluster's ports take connections from anyone who "
            "reaches this machine; unset it to start the cluster with a private token")
        return
    # An unset mode: ray.init turns token mode on itself (setting it here would miss Ray's cached config).
    if os.environ.get("RAY_AUTH_TOKEN"):
        return
    if path := os.environ.get("RAY_AUTH_TOKEN_PATH"):
        try:
            perms = os.stat(os.path.expanduser(path)).st_mode & 0o777
        except OSError as e:
            raise InputError(f"RAY_AUTH_TOKEN_PATH {path}: {e.strerror}") from None
        if perms & 0o077:
            raise InputError(f"RAY_AUTH_TOKEN_PATH {path}: other users can read this token "
                             f"(mode {perms:o}): chmod 600 {path}")
        return
    os.environ["RAY_AUTH_TOKEN"] = secrets.token_hex(32)


def start_agents(student: Any, teacher: Any | None, student_cpus: float = 1,
                 teacher_cpus: float = 1, student_gpus: float = 0,
                 teacher_gpus: float = 0, student_options: dict[str, Any] | None = None,
                 teacher_options: dict[str, Any] | None = None,
                 enable_thinking: bool = False, history: str = "sampled") -> tuple[Agent, Agent | None]:
    """Engine actors for a student and an optional teacher (EngineConfigs, or `EXPERT`: the
    world's expert, no engine). Agents whose tokenizers give the same ids share one ChatFormat,
    so an episode keeps one id list and the teacher can score student tokens (OPD)."""
    import ray

    from rose_ray.chat import ChatFormat
    from rose_ray.inference.actor import engine_actor
    from rose_ray.inference.backends import backend_problem
    from rose_ray.models import load_tokenizer

    # On a one-machine Ray, a backend it cannot run fails before any actor starts (on a cluster
    # the engine fails at start with the same words).
    if len([n for n in ray.nodes() if n.get("Alive")]) <= 1:
        for config in (student, None if teacher == EXPERT else teacher):
            if config is not None and (problem := backend_problem(config.backend.name)) is not None:
                raise InputError(f"engine {config.label}: {problem}")

    def agent(config: Any, chat: Any, name: str, num_cpus: float, num_gpus: float,
              options: dict[str, Any] | None) -> Agent:
        def spawn(generation: int = 0) -> Any:
            opts = dict(options or {})
            if generation and "name" in opts:  # an actor's name must stay unique
                opts["name"] = f"{opts['name']} #{generation}"
            return engine_actor(config, num_cpus=num_cpus, num_gpus=num_gpus, **opts)
        return Agent(spawn(), chat, name, ContextSettings.of(config), spawn=spawn)

    student_tok = load_tokenizer(student.tokenizer or student.model)
    student_chat = ChatFormat(student_tok, enable_thinking, history)
    student_agent = agent(student, student_chat, student.model, student_cpus, student_gpus, student_options)
    if teacher is None:
        return student_agent, None
    if teacher == EXPERT:
        return student_agent, expert_agent(student_agent)
    if teacher == student:  # one engine serves both roles (e.g. `continue` without a student)
        return student_agent, student_agent
    teacher_tok = load_tokenizer(teacher.tokenizer or teacher.model)
    chat = (student_chat if same_tokenizer(student_tok, teacher_tok)
            else ChatFormat(teacher_tok, enable_thinking, history))
    return student_agent, agent(teacher, chat, teacher.label, teacher_cpus, teacher_gpus, teacher_options)


def stop_agents(*agents: Agent | None) -> None:
    """End the engine actors of these agents (an actor shared by two agents once)."""
    import ray

    for engine in {id(a.engine): a.engine for a in agents if a is not None and a.engine is not None}.values():
        ray.kill(engine)


def close_pools(pools: list[Any], timeout_s: float = 30.0) -> None:
    """Close the pools' games (at most `timeout_s`), then end the actors (their JVMs die with them)."""
    import ray

    refs = []
    for pool in pools:
        with contextlib.suppress(Exception):  # a dead pool has no JVMs left to close
            refs.append(pool.close.remote())
    if refs:
        ray.wait(refs, num_returns=len(refs), timeout=timeout_s)
    for pool in pools:
        ray.kill(pool)


async def ping_pools(pools: list[Any], timeout_s: float = 5.0) -> list[str]:
    """One line per env pool that does not answer a ping within `timeout_s` (for the watchdog)."""
    async def ping(i: int, pool: Any) -> str | None:
        try:
            await asyncio.wait_for(pool.num_games.remote(), timeout_s)
            return None
        except asyncio.TimeoutError:
            return f"env pool {i}: no answer to a ping within {timeout_s:g} s (hung?)"
        except Exception as e:  # noqa: BLE001 - dead or restarting: say so
            return f"env pool {i}: {type(e).__name__} (dead or restarting)"

    return [line for line in await asyncio.gather(*(ping(i, p) for i, p in enumerate(pools))) if line]
