"""Generation throughput: concurrent episode-like callers vs the same work one request at a time.

Each caller plays an episode of `--turns` turns against the tiny student: generate a reply
(temperature 1, seeded), append it and a new observation, generate again. N callers run
concurrently through the dynamic batcher (in-process by default, `--ray` through the Ray
actor); the baseline runs exactly the same requests one at a time. Seeded sampling does not
depend on the batch, so both runs generate the same tokens.

    python bench/generation.py                     # 1, 4, 8, 16 callers, 2 torch threads
    python bench/generation.py --ray --callers 8   # through the EngineActor

Prints a table and writes bench/results/generation.json (the latest; each run keeps its own
copy in bench/results/generation/version_N/).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402

from rose_ray.inference.batcher import AsyncBatcher  # noqa: E402
from rose_ray.inference.engine import EngineConfig, GenerationRequest  # noqa: E402
from rose_ray.inference.hf import HFEngine  # noqa: E402
from rose_ray.models import init_tiny  # noqa: E402
from rose_ray.runs import keep_result  # noqa: E402
from rose_ray.types import SamplingParams  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
OBSERVATIONS = [
    "You are in the kitchen. You see a fridge, a stove, a sink and a table.",
    "The fridge is now open. In it you see a glass of orange juice.",
    "You move to the hallway. Doors lead to the kitchen, the workshop and outside.",
    "You pick up the thermometer. It reads 21 degrees celsius.",
    "Nothing happens.",
]


class Episode:
    """The prompt ids of one caller's episode, extended turn by turn like a rollout does."""

    def __init__(self, chat: Any, caller: int) -> None:
        self.chat = chat
        self.caller = caller
        instruction = f"You are agent {caller} in a science world. Answer with Thought and Action. " * 3
        self.ids = chat.opening_ids([("user", instruction), ("assistant", "OK")])
        self.ids += chat.user_ids(OBSERVATIONS[caller % len(OBSERVATIONS)])

    def request(self, turn: int, max_new_tokens: int) -> GenerationRequest:
        sampling = SamplingParams(temperature=1.0, max_new_tokens=max_new_tokens,
                                  seed=1000 * self.caller + turn)
        return GenerationRequest(list(self.ids), sampling, request_id=f"{self.caller}/{turn}")

    def extend(self, token_ids: list[int], turn: int) -> None:
        self.ids += self.chat.finish_sampled(token_ids)
        self.ids += self.chat.user_ids(OBSERVATIONS[(self.caller + turn + 1) % len(OBSERVATIONS)])


def run_sequential(engine: HFEngine, callers: int, turns: int, max_new: int) -> dict[str, Any]:
    episodes = [Episode(engine.chat, c) for c in range(callers)]
    tokens = requests = 0
    t0 = time.perf_counter()
    for ep in episodes:
        for turn in range(turns):
            result = engine.generate([ep.request(turn, max_new)])[0]
            ep.extend(result.token_ids, turn)
            tokens += len(result.token_ids)
            requests += 1
    return {"seconds": time.perf_counter() - t0, "tokens": tokens, "requests": requests,
            "final_ids": [ep.ids for ep in episodes]}


async def _concurrent(call: Any, chat: Any, callers: int, turns: int, max_new: int) -> dict[str, Any]:
    episodes = [Episode(chat, c) for c in range(callers)]
    counts = {"tokens": 0, "requests": 0}

    async def play(ep: Episode) -> None:
        for turn in range(turns):
            result = await call(ep.request(turn, max_new))
            ep.extend(result.token_ids, turn)
            counts["tokens"] += len(result.token_ids)
            counts["requests"] += 1

    t0 = time.perf_counter()
    await asyncio.gather(*(play(ep) for ep in episodes))
    return {"seconds": time.perf_counter() - t0, **counts, "final_ids": [ep.ids for ep in episodes]}


def run_batched(engine: HFEngine, callers: int, turns: int, max_new: int) -> dict[str, Any]:
    async def main() -> dict[str, Any]:
        batcher = AsyncBatcher(engine)
        try:
            out = await _concurrent(batcher.generate, engine.chat, callers, turns, max_new)
            out["batch_sizes"] = batcher.stats()["batcher_batch_sizes"]
            return out
        finally:
            await batcher.close()

    return asyncio.run(main())


def run_actor(actor: Any, chat: Any, callers: int, turns: int, max_new: int) -> dict[str, Any]:
    import ray

    async def call(request: GenerationRequest) -> Any:
        return await actor.generate.remote(request)

    before = len(ray.get(actor.stats.remote())["batch_sizes"])
    out = asyncio.run(_concurrent(call, chat, callers, turns, max_new))
    out["batch_sizes"] = ray.get(actor.stats.remote())["batch_sizes"][before:]
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--callers", type=int, nargs="+", default=[1, 4, 8, 16])
    p.add_argument("--turns", type=int, default=4, help="turns per episode")
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeat", type=int, default=3, help="runs per setting; the fastest counts")
    p.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16"])
    p.add_argument("--max-wait-ms", type=float, default=5.0)
    p.add_argument("--models", default=str(RESULTS / "tiny_models"), help="where init_tiny builds/reuses")
    p.add_argument("--ray", action="store_true", help="concurrent callers go through the Ray EngineActor")
    p.add_argument("--out", default=str(RESULTS / "generation.json"))
    args = p.parse_args()

    torch.set_num_threads(args.threads)
    model = init_tiny(args.models)["student"]
    config = EngineConfig(model=str(model), dtype=args.dtype, threads=args.threads,
                          max_batch_size=max(args.callers), max_wait_ms=args.max_wait_ms, context_tokens=4096)
    engine = HFEngine(config)
    actor = None
    if args.ray:
        import ray

        from rose_ray.inference.actor import engine_actor

        ray.init(num_cpus=args.threads, include_dashboard=False, log_to_driver=False)
        actor = engine_actor(config, num_cpus=args.threads)
        ray.get(actor.ready.remote())
    with ThreadPoolExecutor(max_workers=1) as pool:  # warm-up (first call allocates)
        pool.submit(engine.generate, [Episode(engine.chat, 0).request(0, 4)]).result()

    rows = []
    for n in args.callers:
        # The baseline runs on a worker thread like the batcher's: under CPU contention a
        # multi-thread OpenMP team on the main thread decodes far slower (measured 25x).
        seqs, cons = [], []
        for _ in range(args.repeat):  # best of N: the machine is shared, noise only slows
            with ThreadPoolExecutor(max_workers=1) as pool:
                seqs.append(pool.submit(run_sequential, engine, n, args.turns, args.max_new_tokens).result())
            if actor is not None:
                cons.append(run_actor(actor, engine.chat, n, args.turns, args.max_new_tokens))
            else:
                cons.append(run_batched(engine, n, args.turns, args.max_new_tokens))
        seq = min(seqs, key=lambda r: r["seconds"])
        con = min(cons, key=lambda r: r["seconds"])
        same = seq["final_ids"] == con["final_ids"]
        sizes = con["batch_sizes"]
        rows.append({
            "callers": n, "requests": seq["requests"],
            "sequential_s": seq["seconds"], "concurrent_s": con["seconds"],
            "sequential_tokens_per_s": seq["tokens"] / seq["seconds"],
            "concurrent_tokens_per_s": con["tokens"] / con["seconds"],
            "sequential_requests_per_s": seq["requests"] / seq["seconds"],
            "concurrent_requests_per_s": con["requests"] / con["seconds"],
            "speedup": seq["seconds"] / con["seconds"],
            "mean_batch": sum(sizes) / max(len(sizes), 1), "max_batch": max(sizes, default=0),
            "same_tokens": same, "tokens": seq["tokens"], "concurrent_tokens": con["tokens"],
        })

    mode = "ray actor" if actor is not None else "in-process batcher"
    print(f"tiny student ({engine.model.dtype}), {args.threads} torch threads, {args.turns} turns x "
          f"{args.max_new_tokens} new tokens per episode, concurrent via {mode}")
    head = (f"{'callers':>7} {'requests':>8} {'seq tok/s':>10} {'conc tok/s':>10} {'seq req/s':>9} "
            f"{'conc req/s':>10} {'speedup':>8} {'mean batch':>10} {'same ids':>8}")
    print(head)
    print("-" * len(head))
    for r in rows:
        print(f"{r['callers']:>7} {r['requests']:>8} {r['sequential_tokens_per_s']:>10.0f} "
              f"{r['concurrent_tokens_per_s']:>10.0f} {r['sequential_requests_per_s']:>9.2f} "
              f"{r['concurrent_requests_per_s']:>10.2f} {r['speedup']:>7.2f}x {r['mean_batch']:>10.1f} "
              f"{'yes' if r['same_tokens'] else 'no':>8}")
    kept = keep_result(args.out, json.dumps({
        "bench": "generation", "mode": mode, "model": str(model), "dtype": str(engine.model.dtype),
        "threads": args.threads, "turns": args.turns, "max_new_tokens": args.max_new_tokens,
        "max_wait_ms": args.max_wait_ms, "repeat": args.repeat, "cpu_count": os.cpu_count(), "machine": platform.machine(),
        "torch": torch.__version__, "rows": rows,
    }, indent=2))
    print(f"wrote {args.out} (and {kept})")
    if actor is not None:
        import ray

        ray.shutdown()


if __name__ == "__main__":
    main()
