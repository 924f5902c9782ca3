"""Rollout orchestration alone, at GPU-like speed: turns/s of the real episode loop against the
env pools' own bound, and the driver's CPU per turn.

The engines here are NOT models: they are stand-ins for a GPU-speed engine, Ray actors that
answer every request at once from a recorded set of replies (`RecordedEngine`). The replies
are the 128 shipped gold demonstrations (rose_ray/envs/data/tiny_warmup_gold.jsonl: the first
six gold actions of each game, written as the student answers, "Thought: ...\\nAction: ..."),
then the gold path's detours ("look around", "inventory", "task") in turn up to `--max-turns`.
Everything else is the real thing: EnvPool actors with one ScienceWorld JVM per game, the
EpisodeRunner and `run_episode` (through `play`, as eval and collect call it; train.py
calls `runner.play` + `run_episode` the same way), ROSE's fixed handoff (the student's
stand-in plays 2 turns, the teacher's plays on), per-turn prompt building under
`chat.history` sampled and template, with a tokenizer and chat template shaped like Qwen3's
(`build_tokenizer(style="qwen3")`: Qwen3's pre-tokenizer split and a template that rewrites
history as Qwen3's does; Qwen3's own tokenizer cannot be downloaded here).

Per point (N concurrent episodes = N pool slots, 8 games per EnvPool worker):
  - bound: the same pools play the same games with the same actions, driven by a bare loop
    (reset, then one `pool.step` per action through Ray, N slots at once): no engine, no
    tokenization, no episode bookkeeping. Measured after a warm-up pass (the JVMs' JIT), then
    again after each round of rollouts.
  - rollout: the same games through `play`, once per chat history a round, each pass set
    against the mean of the bound passes before and after it (the machine's load drifts).
  - turns/s (a turn = an engine reply + the env step it causes; resets in the wall time of
    both), fraction_of_bound, the driver's CPU per turn (time.process_time of this process:
    its event loop and Ray's threads), and the JVMs', pool actors' and stand-in engines' CPU
    per turn (psutil); all of this session's processes' CPU per turn against the bound's, which
    says what fraction saturated cores allow (on this 2-core machine everything shares them).
  - the driver's CPU per turn by part, timed in the measured passes (`PartTimer`): chat
    rendering + tokenization (the Conversation's entry points), Ray submits (`.remote`, the
    arguments serialised), the loop (the rest of the event loop thread), Ray's threads (the
    process's CPU outside that thread: replies received and deserialised).
A point is skipped when the RSS it would need (this session's processes now, plus its JVMs and
pool actors at the RSS the last point measured; 330/150 MB before any) is over `--max-rss-gb`.

`--profile` also replays each point's rollouts once more under cProfile (thread CPU time; not
a measured pass) and prints the functions behind each part. cProfile inflates Python-heavy
code several times over, so its shares are indicative; the timed parts are the measure.

    python bench/rollout.py                 # 16, 32, 64, 256 episodes (where memory allows), 4 per slot
    python bench/rollout.py --quick         # 16 episodes, 1 per slot a pass, 1 round (<= 3 min)
    python bench/rollout.py --profile       # and where the driver's CPU goes

Prints a table and writes bench/results/rollout.json (the latest; each run keeps its own copy
in bench/results/rollout/version_N/). Not a test.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import datetime
import json
import os
import platform
import pstats
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import psutil

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import env_step  # noqa: E402  (bench/, this script's folder)

from rose_ray.chat import ChatFormat  # noqa: E402
from rose_ray.envs.protocol import parse_action  # noqa: E402
from rose_ray.envs.sciworld.gold import DETOURS  # noqa: E402
from rose_ray.inference.engine import EngineConfig, GenerationRequest, GenerationResult  # noqa: E402
from rose_ray.rollout.episode import Agent  # noqa: E402
from rose_ray.rollout.handoff import turn_policy  # noqa: E402
from rose_ray.rollout.play import Players, PlaySpec, play  # noqa: E402
from rose_ray.rollout.runner import EpisodeRunner  # noqa: E402
from rose_ray.runs import keep_result  # noqa: E402
from rose_ray.types import GameId  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results" / "rollout.json"
GOLD = Path(__file__).resolve().parent.parent / "rose_ray" / "envs" / "data" / "tiny_warmup_gold.jsonl"
GAMES_PER_WORKER = 8
HISTORIES = ("sampled", "template")
STAND_IN = "stand-in engines (recorded replies, answered at once): GPU-speed engines assumed, no model runs"


# --------------------------------------------------------------------------- recorded replies
def recorded_games(max_turns: int) -> list[tuple[GameId, list[str]]]:
    """(game, the reply texts its episode gets, turn 1..max_turns) for every shipped gold demonstration."""
    out = []
    for line in GOLD.read_text().splitlines():
        row = json.loads(line)
        replies = [m["content"] for m in row["conversations"][3::2] if m["role"] == "assistant"]
        for i in range(max_turns - len(replies)):
            detour = DETOURS[i % len(DETOURS)]
            replies.append(f"Thought: I will check where things are.\nAction: {detour}")
        out.append((GameId(row["task"], row["var"], row["item_id"]), replies[:max_turns]))
    return out


class RecordedEngine:
    """A stand-in for a GPU-speed engine: answers each request at once with the recorded reply
    of its game and turn (read from the request id, `<item_id>/t<turn>`), as sampled ids."""

    def __init__(self, replies: dict[str, list[tuple[str, list[int]]]]) -> None:
        self.replies = replies
        self.calls = 0

    async def ready(self) -> int:
        return os.getpid()

    async def generate(self, request: GenerationRequest) -> GenerationResult:
        self.calls += 1
        item, turn = request.request_id.rsplit("/t", 1)
        text, ids = self.replies[item][int(turn) - 1]
        prompt = len(request.prompt_ids)
        return GenerationResult(text, list(ids), [-0.5] * len(ids), "stop", prompt, 0, request.request_id)


def start_engines(tokenizer: Any, games: list[tuple[GameId, list[str]]]) -> tuple[Agent, Agent, list[int]]:
    """Student and teacher stand-ins (one actor each), as agents of a sampled-history chat
    format (the caller swaps in the format it measures), and their pids."""
    import ray

    chat = ChatFormat(tokenizer)
    replies = {g.item_id: [(text, chat.encode(text) + [chat.eos_id]) for text in texts] for g, texts in games}
    actor = ray.remote(RecordedEngine).options(num_cpus=0, max_concurrency=1000)
    engines = [actor.remote(replies) for _ in range(2)]
    pids = ray.get([e.ready.remote() for e in engines])
    return Agent(engines[0], chat, "student-stand-in"), Agent(engines[1], chat, "teacher-stand-in"), pids


# --------------------------------------------------------------------------- processes
def session_rss_gb() -> float:
    """RSS of this process and all its descendants (Ray's daemons and workers, the JVMs), GiB."""
    return env_step.rss_mb(os.getpid()) / 2**10


def cpu_s(pids: list[int]) -> float:
    total = 0.0
    for pid in pids:
        try:
            t = psutil.Process(pid).cpu_times()
            total += t.user + t.system
        except psutil.NoSuchProcess:
            pass
    return total


def rss_mb(pids: list[int]) -> list[float]:
    out = []
    for pid in pids:
        try:
            out.append(psutil.Process(pid).memory_info().rss / 2**20)
        except psutil.NoSuchProcess:
            pass
    return out


class Processes:
    """The pids whose CPU a phase reports: JVMs, pool actors, stand-in engines."""

    def __init__(self, pools: list[Any], engine_pids: list[int]) -> None:
        import ray

        self.pools = pools
        self.pool_pids = ray.get([p.__ray_call__.remote(lambda self: os.getpid()) for p in pools])
        self.engine_pids = engine_pids

    def jvm_pids(self) -> list[int]:
        import ray

        healths = ray.get([p.health.remote() for p in self.pools])
        return [s["pid"] for slots in healths for s in slots if s["pid"]]

    def snapshot(self) -> dict[str, float]:
        me = psutil.Process()
        return {"driver": time.process_time(), "jvm": cpu_s(self.jvm_pids()),
                "session": cpu_s([me.pid] + [c.pid for c in me.children(recursive=True)]),
                "pool": cpu_s(self.pool_pids), "engine": cpu_s(self.engine_pids), "wall": time.perf_counter()}


def per_turn(before: dict[str, float], after: dict[str, float], turns: int) -> dict[str, float]:
    wall = after["wall"] - before["wall"]
    out = {"wall_s": round(wall, 3), "turns": turns, "turns_per_s": round(turns / wall, 2)}
    for key in ("driver", "jvm", "pool", "engine", "session"):
        out[f"{key}_cpu_ms_per_turn"] = round(1000 * (after[key] - before[key]) / max(turns, 1), 3)
    return out


# --------------------------------------------------------------------------- the two drivers
def plan(games: list[tuple[GameId, list[str]]], slots: int, per_slot: int, offset: int) -> list[tuple[GameId, list[str]]]:
    """`slots * per_slot` games, taken in turn from the recorded ones starting at `offset`."""
    return [games[(offset + i) % len(games)] for i in range(slots * per_slot)]


async def bound_pass(pools: list[Any], jobs: list[tuple[GameId, list[str]]]) -> int:
    """The env pools alone: every job's game reset, then its actions stepped until done, N slots at
    once (N = the pools' games), through Ray from a bare loop. Returns the steps taken."""
    queue: asyncio.Queue = asyncio.Queue()
    for job in jobs:
        queue.put_nowait(job)
    steps = 0

    async def slot_loop(pool: Any, slot: int) -> None:
        nonlocal steps
        while not queue.empty():
            game, replies = queue.get_nowait()
            first = await pool.reset.remote(slot, game)
            assert not first.interrupted, f"{game.item_id}: a JVM died on load"
            for reply in replies:
                result = await pool.step.remote(slot, parse_action(reply).action)
                assert not result.interrupted, f"{game.item_id}: a JVM died"
                steps += 1
                if result.done:
                    break

    await asyncio.gather(*(slot_loop(pool, slot) for slot in range(GAMES_PER_WORKER) for pool in pools))
    return steps


async def rollout_pass(pools: list[Any], jobs: list[tuple[GameId, list[str]]], student: Agent, teacher: Agent,
                       max_turns: int, parts: dict[str, Any] | None = None) -> int:
    """The same games through the real episode loop (`play`: EpisodeRunner + run_episode),
    ROSE's fixed handoff after 2 student turns. Returns the turns played; with `parts`, puts the
    driver's CPU per turn by part there (PartTimer)."""
    players = Players(EpisodeRunner(pools, GAMES_PER_WORKER), student, teacher)
    spec = PlaySpec(student=EngineConfig(model=student.name), teacher=EngineConfig(model=teacher.name),
                    handoff=turn_policy("fixed", k=2), max_turns=max_turns, report="ask")
    with PartTimer() as timer:
        thread, process = time.thread_time(), time.process_time()
        trajectories = await play(spec, [g for g, _ in jobs], players=players)
        thread, process = time.thread_time() - thread, time.process_time() - process
    turns = sum(t.rounds for t in trajectories)
    if parts is not None:
        parts.update(timed_parts(timer, thread, process, turns))
    return turns


# --------------------------------------------------------------------------- profile
PART_CHAT = "chat rendering + tokenization"
PART_RAY = "Ray calls (submit, serialise, await)"
PART_RAY_THREADS = "Ray's own threads in the driver"
PART_LOOP = "the loop (asyncio, episode, runner, rest)"
PART_SUBMIT = "Ray calls: submit (`.remote`, args serialised)"
PART_THREADS = "Ray's threads (replies received, deserialised)"


class PartTimer:
    """The driver's CPU by part, timed in the measured passes themselves (cProfile inflates
    Python-heavy code several times over): the event loop thread's CPU inside the
    Conversation's entry points (every render and tokenization an episode does) and inside
    Ray's `ActorMethod.remote` (submitting a call, its arguments serialised); the loop is the
    rest of that thread's CPU; Ray's threads are the process's CPU outside it."""

    CONVERSATION = ("__init__", "prompt_for", "add_text", "add_reply", "for_learner")

    def __init__(self) -> None:
        self.cpu = {PART_CHAT: 0.0, PART_SUBMIT: 0.0}
        self._inside = False
        self._undo: list[tuple[Any, str, Any]] = []

    def __enter__(self) -> PartTimer:
        from ray.actor import ActorMethod

        from rose_ray.rollout.conversation import Conversation

        for name in self.CONVERSATION:
            self._wrap(Conversation, name, PART_CHAT)
        self._wrap(ActorMethod, "remote", PART_SUBMIT)
        return self

    def __exit__(self, *exc: Any) -> None:
        for owner, name, fn in reversed(self._undo):
            setattr(owner, name, fn)

    def _wrap(self, owner: Any, name: str, part: str) -> None:
        fn = owner.__dict__[name]
        timer = self

        def timed(*args: Any, **kwargs: Any) -> Any:
            if timer._inside:  # a call inside a timed one: counted there
                return fn(*args, **kwargs)
            timer._inside, t0 = True, time.thread_time()
            try:
                return fn(*args, **kwargs)
            finally:
                timer.cpu[part] += time.thread_time() - t0
                timer._inside = False

        setattr(owner, name, timed)
        self._undo.append((owner, name, fn))


def timed_parts(timer: PartTimer, thread_cpu_s: float, process_cpu_s: float, turns: int) -> dict[str, float]:
    """ms of driver CPU per turn, by part."""
    parts = dict(timer.cpu)
    parts[PART_LOOP] = max(thread_cpu_s - sum(timer.cpu.values()), 0.0)
    parts[PART_THREADS] = max(process_cpu_s - thread_cpu_s, 0.0)
    return {k: round(1000 * v / max(turns, 1), 3) for k, v in parts.items()}
RENDERING_CODE = ("/tokenizers/", "/transformers/", "/jinja2/", "<template>", "rose_ray/chat.py", "dataclasses.py")
CONVERSATION_ENTRIES = ("__init__", "prompt_for", "add_text", "add_reply", "for_learner")


def grouped_profile(stats: pstats.Stats, thread_cpu_s: float, process_cpu_s: float) -> dict[str, Any]:
    """The driver's CPU by part. Chat: the cumulative time of the Conversation's entry points
    (they hold every render and tokenization an episode does, none nested in another). Ray: the
    self time of Ray's Python code and of serialisation (pickle) on the event loop's thread, plus
    the process's CPU outside that thread (Ray's core-worker and gRPC threads). The loop: the rest."""
    chat = ray_s = 0.0
    top: dict[str, list[tuple[float, str]]] = {PART_CHAT: [], PART_RAY: [], PART_LOOP: []}
    for (filename, line, name), (_, _, tt, ct, _) in stats.stats.items():  # type: ignore[attr-defined]
        label = f"{Path(filename).name}:{line}({name})" if filename != "~" else name
        if filename.endswith("rose_ray/rollout/conversation.py") and name in CONVERSATION_ENTRIES:
            chat += ct
            top[PART_CHAT].append((ct, label))
        elif "/ray/" in filename or "ray." in name or "_raylet" in name or "pickle" in (filename + name).lower():
            ray_s += tt
            top[PART_RAY].append((tt, label))
        elif filename != "~" and not any(part in filename for part in RENDERING_CODE):
            top[PART_LOOP].append((tt, label))  # (the loop's own code: what rendering calls is chat's)
    loop = max(thread_cpu_s - chat - ray_s, 0.0)
    threads = max(process_cpu_s - thread_cpu_s, 0.0)
    parts = {PART_CHAT: chat, PART_RAY: ray_s, PART_RAY_THREADS: threads, PART_LOOP: loop}
    total = sum(parts.values()) or 1.0
    return {
        "process_cpu_s": round(process_cpu_s, 3),
        "parts": {k: {"cpu_s": round(v, 3), "share": round(v / total, 3)} for k, v in parts.items()},
        "top": {k: [(round(s, 3), lbl) for s, lbl in sorted(v, reverse=True)[:6]] for k, v in top.items()},
    }


async def profiled(coro_fn: Any) -> tuple[Any, dict[str, Any]]:
    profile = cProfile.Profile(time.thread_time)  # this thread's CPU, not wall time spent awaiting
    t_thread, t_process = time.thread_time(), time.process_time()
    profile.enable()
    try:
        result = await coro_fn()
    finally:
        profile.disable()
    thread_cpu, process_cpu = time.thread_time() - t_thread, time.process_time() - t_process
    return result, grouped_profile(pstats.Stats(profile), thread_cpu, process_cpu)


# --------------------------------------------------------------------------- one point
def run_point(episodes: int, games: list[tuple[GameId, list[str]]], agents: dict[str, tuple[Agent, Agent]],
              engine_pids: list[int], per_slot: int, rounds: int, max_turns: int,
              profile: bool) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Rows (one per chat history) for `episodes` concurrent episodes on new pools, and the point's facts.

    After a warm-up pass (the JVMs' JIT), `rounds` times: the bound, then each history's
    rollout; then the bound once more. Each rollout pass is set against the mean of the bound
    passes on either side of it (the machine's load drifts), and a row sums its passes."""
    import ray

    from rose_ray.envs.pool import env_pool_actor
    from rose_ray.rollout.actors import close_pools

    workers = episodes // GAMES_PER_WORKER
    t0 = time.perf_counter()
    for attempt in range(3):  # on a loaded machine a JVM can miss its start-up deadline
        pools = [env_pool_actor(num_games=GAMES_PER_WORKER, num_cpus=0) for _ in range(workers)]
        try:
            ray.get([p.num_games.remote() for p in pools])
            break
        except ray.exceptions.RayActorError as e:
            close_pools(pools)
            if attempt == 2:
                raise
            print(f"  an EnvPool failed to start ({str(e).splitlines()[-1][:120]}); starting them again", flush=True)
    try:
        start_s = time.perf_counter() - t0
        procs = Processes(pools, engine_pids)
        loop = asyncio.new_event_loop()
        same = plan(games, episodes, per_slot, 0)  # the bound and every rollout play the same games

        def measure(coro_fn: Any) -> dict[str, Any]:
            before = procs.snapshot()
            turns = loop.run_until_complete(coro_fn())
            return per_turn(before, procs.snapshot(), turns)

        loop.run_until_complete(bound_pass(pools, same))  # warm-up: the JVMs compile their hot paths
        bounds, passes = [measure(lambda: bound_pass(pools, same))], {h: [] for h in agents}
        for n in range(rounds):  # every other round the other order: the JVMs still speed up as they run
            for history, (student, teacher) in list(agents.items())[:: 1 if n % 2 == 0 else -1]:
                parts: dict[str, float] = {}
                passes[history].append(measure(
                    lambda s=student, t=teacher, p=parts: rollout_pass(pools, same, s, t, max_turns, p)))
                passes[history][-1]["driver_ms_per_turn_by_part"] = parts
            bounds.append(measure(lambda: bound_pass(pools, same)))
        rows = []
        for history, runs in passes.items():
            fractions = [r["turns_per_s"] / ((bounds[i]["turns_per_s"] + bounds[i + 1]["turns_per_s"]) / 2)
                         for i, r in enumerate(runs)]
            turns, wall = sum(r["turns"] for r in runs), sum(r["wall_s"] for r in runs)
            row: dict[str, Any] = {"episodes": episodes, "history": history, "turns": turns, "wall_s": round(wall, 2),
                                   "turns_per_s": round(turns / wall, 2)}
            for key in ("driver", "jvm", "pool", "engine", "session"):
                name = f"{key}_cpu_ms_per_turn"
                row[name] = round(sum(r[name] * r["turns"] for r in runs) / turns, 3)
            row["driver_ms_per_turn_by_part"] = {
                k: round(sum(r["driver_ms_per_turn_by_part"][k] * r["turns"] for r in runs) / turns, 3)
                for k in runs[0]["driver_ms_per_turn_by_part"]}
            row["fraction_of_bound"] = round(sum(fractions) / len(fractions), 3)
            row["fraction_of_bound_per_round"] = [round(f, 3) for f in fractions]
            row["passes"] = runs
            # One event loop drives every episode: at most this many turns/s per driver core.
            row["driver_ceiling_turns_per_s"] = round(1000 / max(row["driver_cpu_ms_per_turn"], 1e-6), 1)
            row["bound_turns_per_s"] = round(sum(b["turns_per_s"] for b in bounds) / len(bounds), 2)
            # All of this session's processes (Ray's daemons too) share the machine's cores: when
            # they are saturated, turns/s goes as 1 / CPU per turn, and this is the fraction to expect.
            bound_cpu = sum(b["session_cpu_ms_per_turn"] for b in bounds) / len(bounds)
            row["bound_session_cpu_ms_per_step"] = round(bound_cpu, 2)
            row["cpu_share_fraction"] = round(bound_cpu / row["session_cpu_ms_per_turn"], 3)
            row["bound_jvm_cpu_ms_per_step"] = round(sum(b["jvm_cpu_ms_per_turn"] for b in bounds) / len(bounds), 2)
            row["bound_pool_cpu_ms_per_step"] = round(sum(b["pool_cpu_ms_per_turn"] for b in bounds) / len(bounds), 2)
            row["bound_driver_cpu_ms_per_step"] = round(
                sum(b["driver_cpu_ms_per_turn"] for b in bounds) / len(bounds), 3)
            assert all(r["turns"] == bounds[0]["turns"] for r in runs), \
                f"rollouts played {[r['turns'] for r in runs]} turns, the bound {bounds[0]['turns']}"
            rows.append(row)
        if profile:
            for row, (student, teacher) in zip(rows, agents.values()):
                _, row["profile"] = loop.run_until_complete(profiled(
                    lambda s=student, t=teacher: rollout_pass(pools, same, s, t, max_turns)))
                row["profile"]["turns"] = bounds[0]["turns"]
        jvm_rss = rss_mb(procs.jvm_pids())
        pool_rss = rss_mb(procs.pool_pids)
        facts = {"episodes": episodes, "workers": workers, "pools_start_s": round(start_s, 1),
                 "jvm_rss_mb_max": round(max(jvm_rss), 1), "jvm_rss_mb_mean": round(sum(jvm_rss) / len(jvm_rss), 1),
                 "pool_actor_rss_mb_mean": round(sum(pool_rss) / len(pool_rss), 1),
                 "session_rss_gb": round(session_rss_gb(), 2), "bounds": bounds}
        loop.close()
    finally:
        close_pools(pools)
    return rows, facts


# --------------------------------------------------------------------------- report
def print_profile(row: dict[str, Any]) -> None:
    p = row["profile"]
    print(f"\ndriver profile, {row['episodes']} episodes, history {row['history']} "
          f"({p['process_cpu_s']:.2f} s CPU over {p['turns']} turns; cProfile on, which inflates Python-heavy "
          "code several times over: the timed parts above are the measure, this says which functions)")
    for part, v in p["parts"].items():
        print(f"  {part:<44} {v['cpu_s']:7.2f} s  {100 * v['share']:5.1f}%  "
              f"{1000 * v['cpu_s'] / p['turns']:6.2f} ms/turn")
        for s, label in p["top"].get(part, [])[:4]:
            print(f"      {s:7.3f} s  {label}")


def print_table(out: dict[str, Any]) -> None:
    print(f"\nrollout ({out['mode']}; {out['cpus_usable']} cores, load average {out['load_average_at_end'][1]} "
          f"over the last 5 min; {out['date']}; max_turns {out['max_turns']}; "
          f"{out['episodes_per_slot']} episodes per slot a pass; {out['rounds']} round(s))")
    print(f"engines: {STAND_IN}")
    head = (f"{'episodes':>8} {'history':>8} {'turns':>6} {'turns/s':>8} {'env bound':>9} {'fraction':>8} "
            f"{'driver ms/turn':>14} {'driver ceiling':>14} {'JVM ms/step':>11} {'pool ms/turn':>12} "
            f"{'engines ms/turn':>15}")
    print(head)
    print("-" * len(head))
    for r in out["rows"]:
        print(f"{r['episodes']:>8} {r['history']:>8} {r['turns']:>6} {r['turns_per_s']:>8.1f} "
              f"{r['bound_turns_per_s']:>9.1f} {r['fraction_of_bound']:>8.2f} {r['driver_cpu_ms_per_turn']:>14.2f} "
              f"{r['driver_ceiling_turns_per_s']:>14.0f} "
              f"{r['bound_jvm_cpu_ms_per_step']:>11.1f} {r['pool_cpu_ms_per_turn']:>12.2f} "
              f"{r['engine_cpu_ms_per_turn']:>15.2f}")
    for p in out["points"]:
        bounds = ", ".join(f"{b['turns_per_s']:.1f}" for b in p["bounds"])
        print(f"  {p['episodes']} episodes: {p['workers']} pools x {GAMES_PER_WORKER} JVMs (started in "
              f"{p['pools_start_s']} s), env bound runs {bounds} turns/s; JVM RSS max {p['jvm_rss_mb_max']} MB, "
              f"session RSS {p['session_rss_gb']} GiB")
    for r in out["rows"]:
        print(f"  {r['episodes']} episodes, {r['history']}: fraction of the bound per round "
              f"{', '.join(f'{f:.2f}' for f in r['fraction_of_bound_per_round'])}; all processes' CPU "
              f"{r['session_cpu_ms_per_turn']:.1f} ms/turn against {r['bound_session_cpu_ms_per_step']:.1f} ms/step "
              f"in the bound (on saturated cores: {r['cpu_share_fraction']:.2f} of the bound)")
    parts = list(out["rows"][0]["driver_ms_per_turn_by_part"]) if out["rows"] else []
    if parts:
        print("\ndriver CPU per turn by part, ms (timed in the measured passes)")
        head = f"{'episodes':>8} {'history':>8} " + " ".join(f"{p[:22]:>22}" for p in parts)
        print(head)
        print("-" * len(head))
        for r in out["rows"]:
            print(f"{r['episodes']:>8} {r['history']:>8} "
                  + " ".join(f"{r['driver_ms_per_turn_by_part'][p]:>22.2f}" for p in parts))
        print("  " + "; ".join(parts))
    for s in out["skipped"]:
        print(f"  skipped {s['episodes']} episodes: {s['why']}")
    print("driver ceiling: 1000 / driver ms per turn, the turns/s one driver core sustains; "
          "JVM ms/step: CPU per step in the bound runs")
    print("goal (issue 35): fraction_of_bound >= 0.8")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="16 episodes, 1 per slot a pass, 1 round (<= 3 min)")
    ap.add_argument("--episodes", default=None, help="comma-separated points (default 16,32,64,256)")
    ap.add_argument("--per-slot", type=int, default=None, help="episodes per slot per pass (default 4; quick 1)")
    ap.add_argument("--max-turns", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=None, help="rollout passes per history, each between two bound "
                    "passes (default 2; quick 1)")
    ap.add_argument("--max-rss-gb", type=float, default=None,
                    help="skip a point whose projected RSS is above this (default: 3/4 of the memory available now)")
    ap.add_argument("--history", default=",".join(HISTORIES), help="chat histories to run (sampled,template)")
    ap.add_argument("--profile", action="store_true", help="print where the driver's CPU goes, by part")
    args = ap.parse_args()
    if args.max_rss_gb is None:  # what this machine can hold beside what already runs on it
        args.max_rss_gb = round(0.75 * psutil.virtual_memory().available / 2**30, 1)
    import ray

    from rose_ray.provision.tiny import build_tokenizer

    points = [int(x) for x in (args.episodes or ("16" if args.quick else "16,32,64,256")).split(",")]
    per_slot = args.per_slot or (1 if args.quick else 4)
    args.rounds = args.rounds or (1 if args.quick else 2)
    t_start = time.perf_counter()
    tokenizer = build_tokenizer(style="qwen3")
    chats = {h: ChatFormat(tokenizer, False, h) for h in args.history.split(",")}
    games = recorded_games(args.max_turns)
    for attempt in range(3):  # on a loaded machine Ray's daemons can miss their start-up deadline
        try:
            ray.init(address="local", include_dashboard=False, log_to_driver=False)
            break
        except Exception as e:  # noqa: BLE001 - Ray raises a bare Exception for a node that timed out
            ray.shutdown()
            if attempt == 2:
                raise
            print(f"Ray did not start ({str(e)[:100]}); starting it again", flush=True)
    rows, facts, skipped = [], [], []
    # RSS of one more JVM and of one more pool actor until the first point measures them: a
    # ScienceWorld JVM measured ~330 MB RSS on this 2-core machine (this bench at 16 episodes,
    # docs/cluster.md); the pool actor's 150 MB is still a guess.
    jvm_mb, pool_mb = 330.0, 150.0
    try:
        student, teacher, engine_pids = start_engines(tokenizer, games)
        # Both histories ask the same stand-ins; each agent renders with its own chat format.
        agents = {h: (replace(student, chat=chat), replace(teacher, chat=chat)) for h, chat in chats.items()}
        for n in points:
            if n % GAMES_PER_WORKER:
                skipped.append({"episodes": n, "why": f"not a multiple of {GAMES_PER_WORKER} games per pool"})
                continue
            base = session_rss_gb()
            need = base + (n * jvm_mb + n // GAMES_PER_WORKER * pool_mb) / 1024
            if need > args.max_rss_gb:
                skipped.append({"episodes": n, "why": f"needs ~{need:.1f} GiB ({n} JVMs at {jvm_mb:.0f} MB, "
                                f"{n // GAMES_PER_WORKER} pool actors at {pool_mb:.0f} MB, {base:.1f} GiB of Ray, "
                                f"this driver and the stand-ins) > --max-rss-gb {args.max_rss_gb}"})
                print(f"skipping {n} episodes: {skipped[-1]['why']}", flush=True)
                continue
            print(f"{n} concurrent episodes ...", flush=True)
            point_rows, point = run_point(n, games, agents, engine_pids, per_slot, args.rounds, args.max_turns,
                                          args.profile)
            rows += point_rows
            facts.append(point)
            jvm_mb, pool_mb = point["jvm_rss_mb_mean"], point["pool_actor_rss_mb_mean"]
            for r in point_rows:
                print(f"  {r['history']}: {r['turns_per_s']:.1f} turns/s, {r['fraction_of_bound']:.2f} of the env "
                      f"bound ({r['bound_turns_per_s']:.1f}), driver {r['driver_cpu_ms_per_turn']:.2f} ms CPU/turn",
                      flush=True)
    finally:
        ray.shutdown()
    out = {
        "bench": "rollout", "mode": "quick" if args.quick else "full", "engines": STAND_IN,
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": platform.machine(), "cpus_usable": len(os.sched_getaffinity(0)),
        "max_turns": args.max_turns, "episodes_per_slot": per_slot, "rounds": args.rounds, "games_per_worker": GAMES_PER_WORKER,
        "tokenizer": f"build_tokenizer(style='qwen3'), {len(tokenizer)} tokens, Qwen3-like template",
        "load_average_at_end": [round(x, 1) for x in os.getloadavg()],  # the machine is shared: what else ran
        "rows": rows, "points": facts, "skipped": skipped, "elapsed_s": round(time.perf_counter() - t_start, 1),
    }
    kept = keep_result(RESULTS, json.dumps(out, indent=2, default=str) + "\n")
    print_table(out)
    if args.profile:
        for r in rows:
            print_profile(r)
    print(f"\nwrote {RESULTS} (and {kept}); {out['elapsed_s']} s")


if __name__ == "__main__":
    main()
