"""Generation throughput, vLLM beside transformers: concurrent episode-like callers on each backend.

Each caller plays an episode of `--turns` turns: generate a reply (temperature 1, seeded),
append it and a new observation, generate again, as a rollout does. N callers run at once
through each backend's async face, the one the engine actor uses (`hf`: the AsyncBatcher
over HFEngine; `vllm`: VLLMEngine, which batches continuously). Both backends run the same
model with the same thread count; they alternate within each repeat, and the fastest of
`--repeat` runs counts (the machine is shared: noise only slows). Models: the tiny student
and a ~30M-parameter Qwen3 built here with random weights (`--models`).

    python bench/generation.py                    # tiny and 30M, 1 / 8 / 32 callers
    python bench/generation.py --quick            # tiny only, 1 and 8 callers, one repeat

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
from pathlib import Path
from typing import Any

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

RESULTS = Path(__file__).resolve().parent / "results"
OBSERVATIONS = [
    "You are in the kitchen. You see a fridge, a stove, a sink and a table.",
    "The fridge is now open. In it you see a glass of orange juice.",
    "You move to the hallway. Doors lead to the kitchen, the workshop and outside.",
    "You pick up the thermometer. It reads 21 degrees celsius.",
    "Nothing happens.",
]
# ~30M parameters with the tiny tokenizer's vocabulary: hidden 512, 8 layers.
MEDIUM = {"hidden_size": 512, "num_hidden_layers": 8, "num_attention_heads": 8, "num_key_value_heads": 4,
          "head_dim": 64, "intermediate_size": 1536}


class Episode:
    """The prompt ids of one caller's episode, extended turn by turn like a rollout does."""

    def __init__(self, chat: Any, caller: int) -> None:
        self.chat = chat
        self.caller = caller
        instruction = f"You are agent {caller} in a science world. Answer with Thought and Action. " * 3
        self.ids = chat.opening_ids([("user", instruction), ("assistant", "OK")])
        self.ids += chat.user_ids(OBSERVATIONS[caller % len(OBSERVATIONS)])

    def request(self, turn: int, max_new_tokens: int) -> Any:
        from rose_ray.inference.engine import GenerationRequest
        from rose_ray.types import SamplingParams

        sampling = SamplingParams(temperature=1.0, max_new_tokens=max_new_tokens, seed=1000 * self.caller + turn)
        return GenerationRequest(list(self.ids), sampling, request_id=f"{self.caller}/{turn}")

    def extend(self, token_ids: list[int], turn: int) -> None:
        self.ids += self.chat.finish_sampled(token_ids)
        self.ids += self.chat.user_ids(OBSERVATIONS[(self.caller + turn + 1) % len(OBSERVATIONS)])


async def play(front: Any, chat: Any, callers: int, turns: int, max_new: int) -> dict[str, float]:
    """`callers` episodes at once through an async face (generate(request) -> result)."""
    episodes = [Episode(chat, c) for c in range(callers)]
    counts = {"tokens": 0, "requests": 0}

    async def one(ep: Episode) -> None:
        for turn in range(turns):
            result = await front.generate(ep.request(turn, max_new))
            ep.extend(result.token_ids, turn)
            counts["tokens"] += len(result.token_ids)
            counts["requests"] += 1

    t0 = time.perf_counter()
    await asyncio.gather(*(one(ep) for ep in episodes))
    return {"seconds": time.perf_counter() - t0, **counts}


def medium_model(root: Path, tiny_student: Path) -> Path:
    """A ~30M-parameter Qwen3 with the tiny tokenizer, random weights, built once."""
    from rose_ray.files import writing_folder
    from rose_ray.models import count_parameters, load_tokenizer
    from rose_ray.provision.tiny import build_tiny_model

    out = root / "qwen3_30m"
    if (out / "config.json").is_file():
        return out
    tok = load_tokenizer(tiny_student)
    model = build_tiny_model(tok, MEDIUM, seed=7)
    with writing_folder(out, "model folder") as tmp:  # whole or not at all
        model.save_pretrained(tmp, safe_serialization=True)
        tok.save_pretrained(tmp)
    print(f"built {out} ({count_parameters(model) / 1e6:.1f}M parameters)")
    return out


def make_engine(backend: str, model: Path, callers: int, threads: int, kv_mb: float) -> Any:
    from rose_ray.inference.backends import command_engine
    from rose_ray.inference.backends import make_engine as build

    # (kv_cache_mb is a vllm setting: the hf engine leaves it)
    config = command_engine(str(model), "--backends", backend, dtype="float32", threads=threads,
                            max_batch_size=callers, context_tokens=4096, kv_cache_mb=kv_mb)
    return build(config)


def bench_model(name: str, model: Path, args: argparse.Namespace) -> list[dict[str, Any]]:
    from rose_ray.inference.batcher import async_frontend
    from rose_ray.models import count_parameters, load_model

    params = count_parameters(load_model(model))
    engines = {b: make_engine(b, model, max(args.callers), args.threads, args.kv_cache_mb) for b in args.backends}
    rows = []
    try:
        for eng in engines.values():  # warm-up: the first calls allocate
            asyncio.run(play(async_frontend(eng), eng.chat, 2, 1, 4))
        for n in args.callers:
            runs: dict[str, list[dict[str, float]]] = {b: [] for b in engines}
            for _ in range(args.repeat):
                for b, eng in engines.items():  # alternated: both see the same machine
                    async def once(eng: Any = eng, n: int = n) -> dict[str, float]:
                        front = async_frontend(eng)
                        try:
                            return await play(front, eng.chat, n, args.turns, args.max_new_tokens)
                        finally:
                            await front.close()
                    runs[b].append(asyncio.run(once()))
            row: dict[str, Any] = {"model": name, "parameters": params, "callers": n}
            for b, rs in runs.items():
                best = max(rs, key=lambda r: r["tokens"] / r["seconds"])
                row[f"{b}_tokens_per_s"] = best["tokens"] / best["seconds"]
                row[f"{b}_requests_per_s"] = best["requests"] / best["seconds"]
                row[f"{b}_tokens"] = best["tokens"]
            if "hf" in engines and "vllm" in engines:
                row["vllm_vs_hf"] = row["vllm_tokens_per_s"] / row["hf_tokens_per_s"]
            rows.append(row)
            print(_line(row, list(engines)), flush=True)
    finally:
        for eng in engines.values():
            getattr(eng, "close", lambda: None)()
    return rows


def _line(r: dict[str, Any], backends: list[str]) -> str:
    cells = [f"{r['model']:>8}", f"{r['parameters'] / 1e6:>6.1f}M", f"{r['callers']:>7}"]
    cells += [f"{r[f'{b}_tokens_per_s']:>12.0f}" for b in backends]
    if "vllm_vs_hf" in r:
        cells.append(f"{r['vllm_vs_hf']:>9.2f}x")
    return " ".join(cells)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="tiny model, 1 and 8 callers, one repeat")
    p.add_argument("--callers", type=int, nargs="+", default=None, help="default 1 8 32")
    p.add_argument("--turns", type=int, default=4, help="turns per episode")
    p.add_argument("--max-new-tokens", type=int, default=48)
    p.add_argument("--threads", type=int, default=1, help="torch threads of each engine (a tiny run's engines get 1)")
    p.add_argument("--repeat", type=int, default=None, help="runs per setting; the fastest counts (default 3)")
    p.add_argument("--backends", nargs="+", default=["hf", "vllm"], choices=["hf", "vllm"])
    p.add_argument("--kv-cache-mb", type=float, default=1024.0, help="vllm's KV cache")
    p.add_argument("--models", default=str(RESULTS / "models"), help="where the models are built/reused")
    p.add_argument("--out", default=str(RESULTS / "generation.json"))
    args = p.parse_args()
    args.callers = args.callers or ([1, 8] if args.quick else [1, 8, 32])
    args.repeat = args.repeat or (1 if args.quick else 3)

    import torch

    torch.set_num_threads(args.threads)  # before vLLM starts (it fixes the count for the process)
    from rose_ray.provision.tiny import init_tiny

    root = Path(args.models)
    tiny = init_tiny(root / "tiny")["student"]
    models = {"tiny": tiny} if args.quick else {"tiny": tiny, "30M": medium_model(root, tiny)}
    load_start = os.getloadavg()
    print(f"{args.turns} turns x {args.max_new_tokens} new tokens per episode (temperature 1, seeded), "
          f"float32, {args.threads} torch threads per engine; tokens/s, best of {args.repeat}")
    head = f"{'model':>8} {'params':>7} {'callers':>7} " + " ".join(f"{b + ' tok/s':>12}" for b in args.backends)
    print(head + (f" {'vllm/hf':>10}" if len(args.backends) == 2 else ""))
    rows = [r for name, m in models.items() for r in bench_model(name, m, args)]
    load_end = os.getloadavg()
    print(f"load average (1/5/15 min): start {'/'.join(f'{x:.2f}' for x in load_start)}, "
          f"end {'/'.join(f'{x:.2f}' for x in load_end)} on {os.cpu_count()} cores")
    from rose_ray.inference.backends import backend_version
    from rose_ray.runs import keep_result

    kept = keep_result(args.out, json.dumps({
        "bench": "generation", "turns": args.turns, "max_new_tokens": args.max_new_tokens, "threads": args.threads,
        "repeat": args.repeat, "backends": args.backends, "vllm": backend_version("vllm"), "torch": torch.__version__,
        "cpu_count": os.cpu_count(), "machine": platform.machine(), "loadavg_start": load_start,
        "loadavg_end": load_end, "finished_at": time.strftime("%Y-%m-%d %H:%M:%S"), "rows": rows,
    }, indent=2))
    print(f"wrote {args.out} (and {kept})")


if __name__ == "__main__":
    main()
