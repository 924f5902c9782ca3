"""vLLM's weight-transfer API for RL beside rose_ray's own weight group, on vLLM's CPU build (not a
test): the comparison behind docs/engines.md's choice of route.

    python bench/vllm_transfer_api.py [--size tiny|0.3] [--repeats 5]

vLLM 0.32's API: an engine started with `weight_transfer_config={"backend": B}` joins a trainer's
group (`init_weight_transfer_engine`), and each update is `start_weight_update`, `update_weights`
(the worker receives each tensor and loads it through the layerwise reload) and
`finish_weight_update`. Its own backends need CUDA, so a gloo engine is registered in its factory
(`WeightTransferEngineFactory.register_engine`), as its docs invite for other transports. rose_ray's
route: the flat buffers of rose_ray/publish/flat.py received over a gloo group, then
`reload_weights`. Both into one in-process vLLM engine; the trainer (rank 0) is another process
broadcasting the same perturbed state. Reported: ms per update (receive, load, prefix-cache reset)
for each route, and whether the greedy outputs after both updates are the same (and differ from
before). `--size tiny`: the tiny student (float32); `0.3`: a Qwen3-0.6B-shaped bf16 model of
~0.3 GiB (bench/publish.py's). Writes bench/results/vllm_transfer_api.json.
"""

from __future__ import annotations

import argparse
import datetime
import json
import multiprocessing as mp
import os
import socket
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rose_ray.runs import keep_result

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
RESULTS = Path(__file__).resolve().parent / "results"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def trainer(port: int, state_path: str, commands: Any, done: Any) -> None:
    """Rank 0: broadcasts the state for each command, one tensor at a time ("api") or as flat
    buffers, one per tensor ("flat"), in each route's own group."""
    import torch
    from safetensors.torch import load_file
    from torch.distributed import PrefixStore, ProcessGroupGloo, TCPStore

    from rose_ray.publish.flat import pack

    torch.set_num_threads(1)
    state = dict(sorted(load_file(state_path).items()))
    timeout = datetime.timedelta(seconds=120)
    store = TCPStore("127.0.0.1", port, 2, is_master=True, wait_for_workers=False, timeout=timeout)
    done.put("ready")
    groups: dict[str, Any] = {}
    while (route := commands.get()) != "stop":
        if route not in groups:
            groups[route] = ProcessGroupGloo(PrefixStore(route, store), 0, 2, timeout)
        group = groups[route]
        tensors = list(state.values()) if route == "api" else pack(state, 0).buffers
        for t in tensors:
            group.broadcast(t.contiguous(), 0).wait()
        done.put(route)


def register_gloo_engine() -> None:
    """A gloo backend for vLLM's weight-transfer factory (its own need CUDA)."""
    import torch
    from torch.distributed import PrefixStore, ProcessGroupGloo, TCPStore
    from vllm.distributed.weight_transfer.base import (
        WeightTransferEngine,
        WeightTransferInitInfo,
        WeightTransferUpdateInfo,
    )
    from vllm.distributed.weight_transfer.factory import WeightTransferEngineFactory
    from vllm.model_executor.model_loader.reload import (
        finalize_layerwise_reload,
        initialize_layerwise_reload,
    )

    @dataclass
    class GlooInit(WeightTransferInitInfo):
        host: str
        port: int
        world_size: int
        rank_offset: int = 1

    @dataclass
    class GlooUpdate(WeightTransferUpdateInfo):
        names: list
        dtype_names: list
        shapes: list

    class GlooEngine(WeightTransferEngine):
        init_info_cls, update_info_cls = GlooInit, GlooUpdate

        def init_transfer_engine(self, info: GlooInit) -> None:
            timeout = datetime.timedelta(seconds=120)
            store = TCPStore(info.host, info.port, info.world_size, is_master=False, timeout=timeout)
            rank = self.parallel_config.rank + info.rank_offset
            self.group = ProcessGroupGloo(PrefixStore("api", store), rank, info.world_size, timeout)

        def start_weight_update(self) -> None:
            initialize_layerwise_reload(self.model)

        def finish_weight_update(self) -> None:
            finalize_layerwise_reload(self.model, self.model_config)

        def update_weights(self, update_info: dict) -> None:  # (the base synchronizes an accelerator)
            self.receive_weights(self.parse_update_info(update_info))

        def receive_weights(self, u: GlooUpdate) -> None:
            for name, dtype, shape in zip(u.names, u.dtype_names, u.shapes):
                t = torch.empty(shape, dtype=getattr(torch, dtype))
                self.group.broadcast(t, 0).wait()
                self.model.load_weights([(name, t)])

        def shutdown(self) -> None:
            self.group = None

    WeightTransferEngineFactory.register_engine("gloo", GlooEngine)


def model_folder(size: str, work: Path) -> Path:
    from rose_ray.provision.tiny import init_tiny

    tiny = init_tiny(work / "tiny", seed=0)["student"]
    if size == "tiny":
        return tiny
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import publish

    return Path(publish.build_model(str(tiny), float(size), work / "model")[0])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--size", choices=["tiny", "0.3"], default="tiny")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--out", default=str(RESULTS / "vllm_transfer_api.json"))
    args = p.parse_args()

    import torch
    from safetensors.torch import load_file, save_file
    from torch.distributed import PrefixStore, ProcessGroupGloo, TCPStore
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    from rose_ray.publish.flat import FlatState, buffers_for, pack, unpack

    torch.set_num_threads(1)
    register_gloo_engine()
    work = Path(tempfile.mkdtemp(prefix="vllm_transfer_api_"))
    folder = model_folder(args.size, work)
    original = {}
    for f in sorted(folder.glob("*.safetensors")):
        original.update(load_file(str(f)))
    g = torch.Generator().manual_seed(1)
    new = {k: (v.float() + torch.randn(v.shape, generator=g) * v.float().std().nan_to_num(0.02)).to(v.dtype)
           for k, v in original.items()}
    if json.loads((folder / "config.json").read_text()).get("tie_word_embeddings"):
        for state in (original, new):  # a tied head goes along with the embedding, as rose_ray sends it
            state["lm_head.weight"] = state["model.embed_tokens.weight"].clone()
    original, new = dict(sorted(original.items())), dict(sorted(new.items()))
    save_file(new, str(work / "new.safetensors"))
    mb = sum(v.numel() * v.element_size() for v in new.values()) / 2**20

    dtype = str(next(iter(new.values())).dtype).replace("torch.", "")
    llm = LLM(model=str(folder), dtype=dtype, max_model_len=1024, enforce_eager=True, seed=0,
              kv_cache_memory_bytes=256 * 2**20, weight_transfer_config={"backend": "gloo"})
    prompts = [TokensPrompt(prompt_token_ids=list(range(10 + i, 300 + i))) for i in range(3)]

    def greedy() -> list[list[int]]:
        outs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=16), use_tqdm=False)
        return [list(o.outputs[0].token_ids) for o in outs]

    def restore() -> None:
        llm.collective_rpc("reload_weights", kwargs={"weights_iterator": list(original.items()),
                                                     "is_checkpoint_format": True})
        llm.reset_prefix_cache()

    before = greedy()
    ctx = mp.get_context("spawn")
    commands, done = ctx.Queue(), ctx.Queue()
    port = free_port()
    proc = ctx.Process(target=trainer, args=(port, str(work / "new.safetensors"), commands, done))
    proc.start()
    assert done.get(timeout=300) == "ready"
    update = {"names": list(new), "dtype_names": [str(t.dtype).replace("torch.", "") for t in new.values()],
              "shapes": [list(t.shape) for t in new.values()]}
    timings: dict[str, list[float]] = {"api": [], "flat": []}
    after: dict[str, list[list[int]]] = {}
    store, group, buffers, header = None, None, None, pack(new, 0).header
    try:
        for n in range(args.repeats):
            commands.put("api")
            t0 = time.perf_counter()
            if n == 0:
                llm.init_weight_transfer_engine({"init_info": {"host": "127.0.0.1", "port": port, "world_size": 2}})
            llm.start_weight_update()
            llm.update_weights({"update_info": update})
            llm.finish_weight_update()
            assert llm.reset_prefix_cache()
            timings["api"].append((time.perf_counter() - t0) * 1e3)
            assert done.get(timeout=600) == "api"
        after["api"] = greedy()
        restore()
        assert greedy() == before
        for _ in range(args.repeats):
            commands.put("flat")
            t0 = time.perf_counter()
            if group is None:
                timeout = datetime.timedelta(seconds=120)
                store = TCPStore("127.0.0.1", port, 2, is_master=False, timeout=timeout)
                group = ProcessGroupGloo(PrefixStore("flat", store), 1, 2, timeout)
            buffers = buffers_for(header, reuse=buffers)
            for b in buffers:
                if b.numel():
                    group.broadcast(b, 0).wait()
            state = unpack(FlatState(header, buffers))
            llm.collective_rpc("reload_weights", kwargs={"weights_iterator": list(state.items()),
                                                         "is_checkpoint_format": True})
            assert llm.reset_prefix_cache()
            timings["flat"].append((time.perf_counter() - t0) * 1e3)
            assert done.get(timeout=600) == "flat"
        after["flat"] = greedy()
    finally:
        commands.put("stop")
        proc.join(timeout=60)
    result = {"size": args.size, "mb": mb, "tensors": len(new), "dtype": dtype, "ms": timings,
              "outputs_changed": after["api"] != before, "same_outputs_both_routes": after["api"] == after["flat"],
              "load_average": os.getloadavg()}
    print(f"{folder} ({len(new)} tensors, {mb:.1f} MB, {dtype}), load average {os.getloadavg()[0]:.1f}")
    print(f"| route | ms per update ({args.repeats}) |\n| --- | --- |")
    print(f"| vLLM's API (gloo engine registered) | {', '.join(f'{x:.0f}' for x in timings['api'])} |")
    print(f"| rose_ray's group + reload_weights | {', '.join(f'{x:.0f}' for x in timings['flat'])} |")
    print(f"greedy outputs changed by the update: {result['outputs_changed']}; "
          f"the same after either route: {result['same_outputs_both_routes']}")
    print("wrote", keep_result(args.out, json.dumps(result, indent=1) + "\n"))


if __name__ == "__main__":
    main()
