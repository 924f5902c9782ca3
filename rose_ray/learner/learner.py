"""The learner: a Ray actor group of DeepSpeed ranks driven by one `LearnerGroup` (train_step,
save/load_checkpoint, export, publish_weights, restart; docs/learner.md). It sees tokens only (each
token's weight in each loss term, learner/losses.py) and never branches on an algorithm. A rank that
dies fails the call at once with `LearnerLost`; calls from several threads take turns."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from rose_ray.errors import ConfigError, first_line
from rose_ray.files import write_file
from rose_ray.learner.batching import micro_batches
from rose_ray.learner.speed import (
    ATTN_IMPLEMENTATIONS,
    CHECKPOINTING,
    FUSED_KERNELS,
    HEADS,
    OPTIMIZERS,
)
from rose_ray.learner.worker import SUMMED, CheckpointUnreadable, LearnerWorker
from rose_ray.types import CONTEXT_TOKENS, Batch

SCHEDULES = ("constant", "linear", "cosine")
LEARNER_DTYPES = ("float32", "bfloat16")
EXPORT_DTYPES = ("auto", "float32", "bfloat16", "float16")
DIST_BACKENDS = ("auto", "gloo", "nccl")


@dataclass
class LearnerConfig:
    model: str = ""  # the model it starts from (`rose-ray train`: the student engine's)
    clip_eps: float = 0.2  # the OPD term's importance-ratio clip
    ranks: int = 1  # DeepSpeed data-parallel ranks
    zero_stage: int = 0  # DeepSpeed ZeRO stage: 0, 1, 2 or 3
    dtype: str = "float32"  # float32 | bfloat16 (with fp32 master weights and Adam states)
    lr: float = 1e-5  # the peak learning rate (AdamW)
    weight_decay: float = 0.0  # AdamW's decoupled weight decay
    adam_beta1: float = 0.9  # AdamW's first-moment decay
    adam_beta2: float = 0.999  # AdamW's second-moment decay
    adam_eps: float = 1e-8  # AdamW's epsilon
    schedule: str = "constant"  # constant | linear | cosine (the rate of each step: learner/lr)
    warmup_steps: int = 0  # linear warm-up from lr / warmup_steps
    total_steps: int = 0  # the steps linear / cosine decay over (`rose-ray train`: its `steps`)
    min_lr_ratio: float = 0.0  # where a linear or cosine decay ends, as a share of lr
    grad_clip: float = 1.0  # 0 disables
    # tokens per packed row, at least the student engine's context; also a micro-batch's budget
    max_tokens: int = CONTEXT_TOKENS
    # The speed settings (docs/learner.md has what each costs): `auto` takes the fastest that
    # runs here. How packed segments are kept apart (auto: flash_attention_2 on GPUs with
    # flash-attn under bf16, else torch_varlen on GPUs, else sdpa_varlen; dense_mask: the reference)
    attn_implementation: str = "auto"
    # The LM head: full (every token, in chunks), trained (only the tokens a loss term weighs),
    # cce or liger (fused kernels on those tokens; CUDA)
    head: str = "auto"
    logprob_chunk: int = 1024  # tokens per pass through the LM head (0: the whole micro-batch at once)
    optimizer: str = "auto"  # adamw_fused | adamw (torch's default implementation); auto: fused on GPUs
    activation_checkpointing: str = "none"  # none | full | selective (every second decoder layer)
    fused_kernels: str = "auto"  # liger | compile | none; auto: Liger's RMSNorm/RoPE/SwiGLU where it runs
    # reduce gradients while backward runs (null: auto, on for ZeRO 1-2 over several GPU ranks)
    overlap_comm: bool | None = None
    zero_bucket_size: int = 500_000_000  # elements per ZeRO communication bucket
    seed: int = 0  # torch, numpy and random on every rank
    threads: int = 1  # torch threads per rank
    cpus_per_rank: float = 1.0  # Ray CPUs of each rank
    gpus_per_rank: float = 0.0  # Ray GPUs of each rank (a fraction to share one)
    backend: str = "auto"  # gloo on CPU, nccl on GPU
    export_dtype: str = "auto"  # auto: the dtype the source model declares
    initial_version: int = 0  # the policy version of the starting weights

    def __post_init__(self) -> None:
        def need(ok: bool, key: str, msg: str) -> None:
            if not ok:
                raise ConfigError(f"learner.{key}: {msg}, got {getattr(self, key)!r}")

        need(isinstance(self.model, str) and bool(self.model), "model", "a model path or name is required")
        for key, allowed in (("zero_stage", (0, 1, 2, 3)), ("dtype", LEARNER_DTYPES), ("schedule", SCHEDULES),
                             ("attn_implementation", ATTN_IMPLEMENTATIONS), ("head", HEADS),
                             ("optimizer", OPTIMIZERS), ("activation_checkpointing", CHECKPOINTING),
                             ("fused_kernels", FUSED_KERNELS), ("backend", DIST_BACKENDS),
                             ("export_dtype", EXPORT_DTYPES)):
            need(getattr(self, key) in allowed, key, f"must be one of {allowed}")
        for keys, ok, rule in ((("lr", "adam_eps", "cpus_per_rank"), lambda v: v > 0, "> 0"),
                               (("weight_decay", "warmup_steps", "grad_clip", "logprob_chunk",
                                 "gpus_per_rank", "initial_version"), lambda v: v >= 0, ">= 0"),
                               (("ranks", "threads"), lambda v: v >= 1, ">= 1"),
                               (("max_tokens",), lambda v: v >= 2, ">= 2"),
                               (("zero_bucket_size",), lambda v: v >= 1_000_000, ">= 1e6 elements"),
                               (("adam_beta1", "adam_beta2"), lambda v: 0 <= v < 1, "in [0, 1)"),
                               (("min_lr_ratio",), lambda v: 0 <= v <= 1, "in [0, 1]"),
                               (("clip_eps",), lambda v: 0 < v < 1, "in (0, 1)")):
            for key in keys:
                need(ok(getattr(self, key)), key, f"must be {rule}")
        need(self.schedule == "constant" or self.total_steps > self.warmup_steps, "total_steps",
             f"must exceed learner.warmup_steps={self.warmup_steps} for a {self.schedule} schedule "
             "(in a run it defaults to `steps`)")
        need(self.attn_implementation not in ("flash_attention_2", "torch_varlen")
             or (self.dtype == "bfloat16" and self.gpus_per_rank > 0), "attn_implementation",
             f"{self.attn_implementation} needs learner.dtype=bfloat16 and GPUs (learner.gpus_per_rank > 0)")
        for key in ("head", "fused_kernels"):
            need(getattr(self, key) not in ("cce", "liger") or self.gpus_per_rank > 0, key,
                 f"{getattr(self, key)} is a Triton kernel: it needs GPUs (learner.gpus_per_rank > 0)")
        need(self.fused_kernels != "compile" or self.zero_stage < 3, "fused_kernels",
             "compile runs under ZeRO 0-2 (ZeRO-3 gathers parameters in hooks the compiled regions would trace)")

    def check_rows(self, context_tokens: int) -> None:
        if self.max_tokens < context_tokens:
            raise ConfigError(f"learner.max_tokens: {self.max_tokens} is less than student_engine.context_tokens "
                              f"{context_tokens}; a packed row must hold whatever the engine kept "
                              "(the learner cuts a trajectory only where the engine did)")


def write_latest(path: str | Path, tag: str) -> None:
    """`path/latest` names checkpoint `tag` (atomic, on disk): the mark that it is whole."""
    write_file(Path(path) / "latest", tag)


class LearnerLost(RuntimeError):
    """A learner rank died or stopped answering; the group must be restarted (`restart`)."""


class LearnerGroup:
    """N learner ranks forming one torch.distributed group under DeepSpeed."""

    def __init__(self, config: LearnerConfig,
                 worker_options: Callable[[int], dict[str, Any]] | None = None) -> None:
        self.config = config
        self.step = 0  # setup sets it, `version` and `skipped_nonfinite` (steps skipped as not finite)
        self.worker_options = worker_options  # (rank) -> scheduling options, e.g. a placement-group bundle
        self._lock = threading.RLock()
        self.workers: list[Any] = []
        self.restart()

    def restart(self) -> None:
        """Kill every rank and start new ones on the same placement (load a checkpoint next)."""
        import ray

        with self._lock:
            self.shutdown()
            config = self.config
            worker = ray.remote(num_cpus=config.cpus_per_rank, num_gpus=config.gpus_per_rank)(LearnerWorker)
            self.workers = [worker.options(**(self.worker_options(r) if self.worker_options else {}))
                            .remote(r, config.ranks, config.threads) for r in range(config.ranks)]
            addr, port = self._get([self.workers[0].address.remote()], "start")[0]
            self._get([w.init_distributed.remote(addr, port, config.backend) for w in self.workers], "start")
            self.info = self.setup()

    def _get(self, refs: list[Any], what: str) -> list[Any]:
        """ray.get, failing as soon as any rank fails; LearnerLost when a rank is gone."""
        import ray

        try:
            pending = list(refs)
            while pending:
                done, pending = ray.wait(pending, num_returns=1)
                ray.get(done)  # raises now if that rank failed
            return ray.get(refs)
        except Exception as e:
            gone = self._gone_ranks()
            if gone:
                raise LearnerLost(f"learner rank {gone[0]} lost during {what} after step {self.step} "
                                  f"({first_line(e, True)})") from e
            raise

    def _gone_ranks(self, timeout_s: float = 10.0) -> list[int]:
        """Ranks that are dead or do not answer (a survivor stuck in a collective)."""
        import ray

        refs = [w.__ray_ready__.remote() for w in self.workers]
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=timeout_s)
        gone = []
        for rank, ref in enumerate(refs):
            try:
                if ref not in ready:
                    raise TimeoutError
                ray.get(ref)
            except Exception:  # noqa: BLE001 - dead or silent: either way not a rank to use
                gone.append(rank)
        return gone

    def _all(self, method: str, *args: Any) -> list[Any]:
        with self._lock:
            return self._get([getattr(w, method).remote(*args) for w in self.workers], method)

    def setup(self, **overrides: Any) -> dict[str, Any]:
        """(Re)build every rank's engine from the model path; overrides change the config
        (not `ranks`). Step and version restart."""
        if overrides:
            if overrides.get("ranks", self.config.ranks) != self.config.ranks:
                raise ValueError("learner.ranks: a group cannot change its size; make a new group")
            self.config = LearnerConfig(**{**asdict(self.config), **overrides})
        self.step, self.version, self.skipped_nonfinite = 0, self.config.initial_version, 0
        info = self._all("setup", self.config)[0]
        print("learner: " + ", ".join(f"{k}={v}" + (" (auto)" if getattr(self.config, k) in ("auto", None) else "")
                                      for k, v in info["speed"].items()), flush=True)
        return info

    def train_step(self, batch: Batch) -> dict[str, float]:
        """One optimizer step on a global batch; returns metrics (means over the batch)."""
        from rose_ray.learner.losses import denominators  # torch: only where a step is taken

        den = denominators(batch)
        parts = micro_batches(batch, self.config.ranks, self.config.max_tokens)
        with self._lock:
            start = time.perf_counter()
            results = self._get([w.train_step.remote(parts[r], den)
                                 for r, w in enumerate(self.workers)], "train_step")
            elapsed = time.perf_counter() - start
            skipped = results[0]["skipped_nonfinite"] > 0  # every rank skips or none does
            self.step += 1
            if skipped:  # the weights are those of the last step: no new version to publish
                self.skipped_nonfinite += 1
                print(f"learner: step {self.step} skipped: its loss or gradient norm is not finite "
                      f"({self.skipped_nonfinite} skipped so far); the weights stay as they were", flush=True)
            else:
                self.version += 1
        summed = dict.fromkeys(k for res in results for k in res if k.startswith(SUMMED))
        metrics = {k.removeprefix(SUMMED): sum(res.get(k, 0.0) for res in results) for k in summed}
        first = results[0]
        versions = np.asarray(batch.versions) if batch.versions is not None else np.zeros((0,))
        sampled = versions[versions >= 0]
        metrics.update(
            grad_norm=first["grad_norm"], lr=first["lr"], step_s=elapsed, micro_batches=first["micro_batches"],
            tokens_per_s=metrics.get("tokens", 0.0) / elapsed,
            trained_tokens=sum(den.values()),  # tokens carrying a loss term (a token in two terms counts twice)
            policy_lag=float((self.version - 1 - sampled).mean()) if sampled.size else 0.0,
            dropped_turns=float(batch.meta.get("dropped_turns", 0)),
            skipped_nonfinite=float(self.skipped_nonfinite),  # steps skipped so far (in this group)
            step=float(self.step), version=float(self.version),
        )
        return metrics

    def logits(self, input_ids: np.ndarray) -> np.ndarray:
        """Logits of the current model for unpacked rows [B, L] -> [B, L, V]."""
        return self._all("logits", np.asarray(input_ids))[0]

    def save_checkpoint(self, path: str | Path, mark_latest: bool = True, folder: str | None = None) -> str:
        """Model, optimizer, scheduler, per-rank RNG, step and version under path/step_<n> (or
        path/`folder`), fsynced before `path/latest` names it (`mark_latest`; else the caller
        calls `write_latest` last). NonFiniteWeights when the weights are not finite."""
        with self._lock:  # the step and version read are those of the weights saved
            tag = folder or f"step_{self.step}"
            self._all("save_checkpoint", str(path), tag, {"step": self.step, "version": self.version})
        if mark_latest:
            write_latest(path, tag)
        return tag

    def load_checkpoint(self, path: str | Path, tag: str | None = None) -> dict[str, Any]:
        """Resume exactly; `tag` defaults to the latest. CheckpointUnreadable names a bad file."""
        latest = Path(path) / "latest"
        if tag is None:
            if not latest.is_file():
                raise FileNotFoundError(f"no checkpoint under {path} (missing {latest})")
            tag = latest.read_text().strip()
        try:
            state = self._all("load_checkpoint", str(path), tag)[0]
        except Exception as e:
            # the rank that met the bad file, or LearnerLost caused by it
            unreadable = next((x for x in (e, e.__cause__) if isinstance(x, CheckpointUnreadable)), None)
            if unreadable is None:
                raise
            raise CheckpointUnreadable(str(unreadable.args[0]) if unreadable.args else str(unreadable)) from None
        self.step, self.version = int(state["step"]), int(state["version"])
        return {"tag": tag, **state}

    def export(self, out_dir: str | Path, extra_files: dict[str, str] | None = None) -> dict[str, Any]:
        """A Hugging Face folder of the current weights, written whole, with `extra_files` {name: text}."""
        return self._all("export", str(out_dir), extra_files)[0]

    def publish_weights(self, engines: list[Any], config: Any = None) -> dict[str, Any]:
        """Current weights + version to every engine actor by `config` (a PublishConfig); returns
        the method, timing per stage (ms) and size (MB)."""
        with self._lock:  # the version read is the version of the weights sent
            out = self._all("publish", list(engines), self.version, config)[0]
        out["ms_per_mb"] = out["total_ms"] / max(out["mb"], 1e-9)
        return out

    def shutdown(self) -> None:
        import ray

        for w in self.workers:
            ray.kill(w)
        self.workers = []
