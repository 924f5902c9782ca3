"""One learner rank: a DeepSpeed engine in a Ray actor, one member of a torch.distributed group.
The loss is scaled by world_size before `engine.backward`: DeepSpeed averages gradients over
ranks, while our loss shares are already global means."""

from __future__ import annotations

import contextlib
import math
import os
import pickle
import random
import re
import socket
import time
from pathlib import Path
from typing import Any

import numpy as np

from rose_ray.errors import InputError, first_line
from rose_ray.files import crash_point, fsync_dir, writing_file

SUMMED = "sum/"  # prefix of metrics that are shares of a global value (the driver adds them)


def ds_config(cfg: Any, world_size: int) -> dict[str, Any]:
    """The DeepSpeed config dict for a LearnerConfig."""
    zero: dict[str, Any] = {"stage": cfg.zero_stage}  # (DeepSpeed's defaults: no 16-bit save, no prints)
    if cfg.zero_stage >= 1:
        zero["reduce_bucket_size"] = cfg.zero_bucket_size
        if cfg.zero_stage < 3:
            zero["allgather_bucket_size"] = cfg.zero_bucket_size
        overlap = overlap_comm(cfg, world_size)
        if overlap is not None:
            zero["overlap_comm"] = overlap
    return {
        # Micro-batches vary in size and number; the worker marks the accumulation boundary.
        "train_micro_batch_size_per_gpu": 1,
        "gradient_accumulation_steps": 1,
        "train_batch_size": world_size,
        "gradient_clipping": cfg.grad_clip,
        "zero_optimization": zero,
        # A step whose gradients are not finite is skipped (said here: a non-finite loss relies on it)
        "bf16": {"enabled": cfg.dtype == "bfloat16", "check_grad_overflow": True},
        "zero_allow_untested_optimizer": True,  # a plain torch AdamW: no fused op to compile
    }


def overlap_comm(cfg: Any, world_size: int) -> bool | None:
    """`learner.overlap_comm` as it runs: auto is on for ZeRO 1-2 over several GPU ranks (the
    gradients' reduction overlaps backward) and DeepSpeed's default elsewhere (None)."""
    if cfg.overlap_comm is not None:
        return bool(cfg.overlap_comm)
    return True if cfg.gpus_per_rank > 0 and world_size > 1 and cfg.zero_stage in (1, 2) else None


def _rng_state() -> dict[str, Any]:
    """Every RNG's state as tensors, lists and numbers only: `torch.load(weights_only=True)`
    reads it back, and nothing in a run folder runs as code."""
    import torch

    version, words, gauss = random.getstate()
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    state = {"python": [version, list(words), gauss],
             "numpy": [kind, torch.from_numpy(keys.astype(np.int64)), pos, has_gauss, cached],
             "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _restore_rng_state(path: Path) -> None:
    """Every RNG's state from a rank's file, read `weights_only`; one holding more than tensors,
    lists and numbers (an older file's numpy arrays, code) is refused, naming what it holds."""
    import torch

    try:
        state = torch.load(path, weights_only=True)
    except (RuntimeError, OSError, EOFError, ValueError, pickle.UnpicklingError) as e:
        held = re.search(r"GLOBAL (\S+)", str(e))  # torch's message is advice to load it as code
        why = f"it holds {held[1]}, not only tensors, lists and numbers" if held else first_line(e, True)
        raise CheckpointUnreadable(f"{path}: cannot be read ({why})") from None
    version, words, gauss = state["python"]
    random.setstate((version, tuple(words), gauss))
    kind, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((kind, np.asarray(keys).astype(np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


class CheckpointUnreadable(InputError):
    """A checkpoint's files cannot be read (a shard cut short or corrupt)."""


class NonFiniteWeights(RuntimeError):
    """The weights hold NaN or infinity: no checkpoint is written from them."""


class LearnerWorker:
    """A learner rank. Wrapped with ray.remote by LearnerGroup."""

    def __init__(self, rank: int, world_size: int, threads: int) -> None:
        import torch

        self.rank, self.world_size = rank, world_size
        if not torch.cuda.is_available():
            os.environ.setdefault("DS_ACCELERATOR", "cpu")
        torch.set_num_threads(threads)  # Ray sets OMP_NUM_THREADS=1 in actors
        self.engine: Any = None
        self.cfg: Any = None
        self._publisher: Any = None  # rank 0's WeightPublisher

    def address(self) -> tuple[str, int]:
        """This node's IP and a free port for the group's rendezvous (called on rank 0)."""
        import ray

        with socket.socket() as s:
            s.bind(("", 0))
            port = s.getsockname()[1]
        return ray.util.get_node_ip_address(), port

    def init_distributed(self, addr: str, port: int, backend: str) -> None:
        import deepspeed
        import torch

        if backend == "auto":
            backend = "nccl" if torch.cuda.is_available() else "gloo"
        os.environ.update(
            MASTER_ADDR=addr, MASTER_PORT=str(port), RANK=str(self.rank),
            WORLD_SIZE=str(self.world_size), LOCAL_RANK="0",  # Ray shows each rank one GPU
        )
        deepspeed.init_distributed(
            dist_backend=backend, auto_mpi_discovery=False, verbose=False,
            rank=self.rank, world_size=self.world_size,
        )

    def setup(self, cfg: Any) -> dict[str, Any]:
        """(Re)build model, optimizer, scheduler and engine from `cfg.model`."""
        import deepspeed
        import torch
        from transformers import AutoConfig, AutoModelForCausalLM, set_seed

        from rose_ray.learner import attention, speed
        from rose_ray.learner.forward import PackedForward

        self.engine = None
        self.cfg = cfg
        set_seed(cfg.seed)  # random, numpy and torch
        chosen = speed.chosen(cfg, AutoConfig.from_pretrained(cfg.model).model_type, torch.cuda.is_available())
        attn = chosen["attn_implementation"]
        # fp32 master weights; under bf16 DeepSpeed casts the module's parameters itself.
        model = AutoModelForCausalLM.from_pretrained(cfg.model, dtype=torch.float32,
                                                     attn_implementation=attention.transformers_name(attn))
        if getattr(model.config, "final_logit_softcapping", None):
            raise InputError(f"learner.model: {cfg.model} caps its logits after the head, which the "
                             "chunked head does not do")
        model.config.use_cache = False
        speed.apply_checkpointing(model, chosen["activation_checkpointing"])
        speed.apply_fused_kernels(model, chosen["fused_kernels"])
        self.packed = PackedForward(model, attn, cfg.logprob_chunk, chosen["head"])
        buffers = {n: b.detach().clone() for n, b in model.named_buffers()}
        opt = speed.make_optimizer(chosen["optimizer"], model.parameters(), cfg)

        def rate(step: int) -> float:  # lr's factor: linear warm-up, then constant/linear/cosine decay
            if step < cfg.warmup_steps:
                return (step + 1) / cfg.warmup_steps
            if cfg.schedule == "constant":
                return 1.0
            frac = min((step - cfg.warmup_steps) / max(cfg.total_steps - cfg.warmup_steps, 1), 1.0)
            shape = 1.0 - frac if cfg.schedule == "linear" else 0.5 * (1.0 + math.cos(math.pi * frac))
            return cfg.min_lr_ratio + (1.0 - cfg.min_lr_ratio) * shape

        sched = torch.optim.lr_scheduler.LambdaLR(opt, rate)
        self.engine, _, _, _ = deepspeed.initialize(
            model=model, optimizer=opt, lr_scheduler=sched,
            config=ds_config(cfg, self.world_size), dist_init_required=False,
        )
        module = self.engine.module
        for name, buf in list(module.named_buffers()):  # (e.g. rotary inv_freq) in the model's own dtype
            if name in buffers and buf.dtype != buffers[name].dtype:
                owner, _, leaf = name.rpartition(".")
                module.get_submodule(owner)._buffers[leaf] = buffers[name].to(buf.device)
        self.engine.train()
        params = module.parameters()
        return {"parameters": int(sum(getattr(p, "ds_numel", p.numel()) for p in params)),
                "speed": {**chosen, "overlap_comm": overlap_comm(cfg, self.world_size)}}

    def train_step(self, parts: list[dict[str, np.ndarray]], den: dict[str, float]) -> dict[str, float]:
        """One optimizer step over this rank's micro-batches; metrics are read back once."""
        import torch

        from rose_ray.learner.batching import trained_targets
        from rose_ray.learner.losses import aligned
        from rose_ray.learner.losses import loss as batch_loss

        start = time.perf_counter()
        sums: dict[str, Any] = {}
        lr = float(self.engine.get_lr()[0])
        for i, part in enumerate(parts):
            # Gradients are reduced once, after the last micro-batch; then one optimizer step.
            self.engine.set_gradient_accumulation_boundary(i == len(parts) - 1)
            # np.array copies: Ray hands actors read-only views of numpy arguments
            t = {k: torch.from_numpy(np.array(v)).to(self.engine.device) for k, v in part.items()}
            hidden = self.packed.hidden_states(self.engine, t, part["cu_seq_lens"].tolist())
            trained = torch.from_numpy(trained_targets(part)).to(hidden.device)  # the head scores these
            logp = self.packed.token_logprobs(hidden, t["input_ids"], trained)
            loss, metrics = batch_loss(logp, aligned(t), den, self.cfg.clip_eps)
            metrics["loss"] = loss.detach()
            # A non-finite loss makes every gradient NaN, so every rank skips the step together.
            loss = loss * torch.where(torch.isfinite(loss.detach()), 1.0, float("nan"))
            self.engine.backward(loss * self.world_size)
            metrics["tokens"] = float((part["attention_mask"] > 0).sum())
            for k, v in metrics.items():
                sums[SUMMED + k] = sums.get(SUMMED + k, 0.0) + v
        on_device = [k for k, v in sums.items() if torch.is_tensor(v)]
        if on_device:  # one read back for every metric of every micro-batch
            sums.update(zip(on_device, torch.stack([sums[k].float() for k in on_device]).tolist()))
        own_norm = None  # the pre-clip gradient norm where DeepSpeed keeps none (plain fp32 without ZeRO)
        if self.cfg.zero_stage == 0 and self.cfg.dtype == "float32":
            params = self.engine.module.parameters()
            grads = [p.grad.detach().float().norm() for p in params if p.grad is not None]
            own_norm = float(torch.stack(grads).norm()) if grads else 0.0
        if own_norm is not None and not math.isfinite(own_norm):
            self.engine.zero_grad()  # the plain optimizer (fp32, no ZeRO): no step, nothing learned from it
            applied, norm = False, own_norm
        else:
            self.engine.step()
            applied = self.engine.was_step_applied()
            norm = self.engine.get_global_grad_norm()
            norm = own_norm if norm is None else norm
        sums.update(grad_norm=float(norm) if norm is not None else float("nan"), lr=lr,
                    micro_batches=float(len(parts)), rank_step_s=time.perf_counter() - start,
                    skipped_nonfinite=0.0 if applied else 1.0)
        return sums

    def logits(self, input_ids: np.ndarray) -> np.ndarray | None:
        """Logits of unpacked rows (every rank runs the forward; rank 0 returns them)."""
        import torch

        ids = torch.from_numpy(np.array(input_ids, dtype=np.int64)).to(self.engine.device)
        pos = torch.arange(ids.shape[1], device=ids.device).expand_as(ids)
        vocab = self.packed.head.out_features
        out = torch.empty((*ids.shape, vocab), dtype=torch.float32) if self.rank == 0 else None
        with torch.no_grad():
            self.packed.logits_into(self.packed.hidden_states(self.engine, {"input_ids": ids, "position_ids": pos}), out)
        return out.numpy() if out is not None else None

    # -- checkpoints ---------------------------------------------------------------------

    def save_checkpoint(self, path: str, tag: str, client_state: dict[str, Any]) -> None:
        """This rank's share of checkpoint `path/tag`, on disk; the driver marks it complete."""
        import torch

        if not self._weights_finite():
            raise NonFiniteWeights(f"learner: the weights after step {client_state.get('step')} hold NaN or "
                                   f"infinity; no checkpoint {tag} is written from them")
        with writing_file(Path(path) / tag / f"rng_rank{self.rank}.pt", "wb") as f:
            torch.save(_rng_state(), f)
        crash_point("checkpoint-write")  # the tests' kill in the middle of a save
        self.engine.save_checkpoint(path, tag=tag, client_state=client_state, save_latest=False)
        for root, _, files in os.walk(Path(path) / tag):  # on disk: a whole checkpoint survives a crash
            for name in files:  # (fsync_dir opens any path read-only and fsyncs it)
                with contextlib.suppress(FileNotFoundError):  # another rank's temporary file, renamed
                    fsync_dir(Path(root, name))
            fsync_dir(Path(root))

    def _weights_finite(self) -> bool:
        """Whether every rank's weights are finite (the same answer on every rank)."""
        import torch
        import torch.distributed as dist

        with torch.no_grad():  # (ZeRO-3: each rank's partition)
            params = self.engine.module.parameters()
            bad = any(not torch.isfinite(getattr(p, "ds_tensor", p)).all() for p in params)
        count = torch.tensor(float(bad), device=self.engine.device)
        dist.all_reduce(count)
        return bool(count.item() == 0)

    def load_checkpoint(self, path: str, tag: str) -> dict[str, Any]:
        folder = Path(path) / tag
        try:
            loaded, client = self.engine.load_checkpoint(
                path, tag=tag, load_optimizer_states=True, load_lr_scheduler_states=True
            )
        except (RuntimeError, OSError, EOFError, ValueError, KeyError, pickle.UnpicklingError) as e:
            raise CheckpointUnreadable(f"{folder}: cannot be read ({first_line(e, True)})") from None
        if loaded is None:
            raise FileNotFoundError(f"no DeepSpeed checkpoint {tag!r} under {path}")
        _restore_rng_state(folder / f"rng_rank{self.rank}.pt")
        return {k: v for k, v in (client or {}).items() if k in ("step", "version")}

    # -- full weights: export and publication ----------------------------------------------

    def full_state(self, dtype: str | None = None, device: Any = "cpu") -> dict[str, Any] | None:
        """Full weights on rank 0 (learner/export.py `gather_state`; every rank must call)."""
        from rose_ray.learner.export import gather_state

        return gather_state(self.engine.module, self.cfg.zero_stage == 3, self.rank == 0, dtype, device)

    def export(self, out_dir: str, extra_files: dict[str, str] | None = None) -> dict[str, Any] | None:
        from transformers import AutoConfig

        from rose_ray.learner.export import write_hf_folder

        dtype = self.cfg.export_dtype
        if dtype == "auto":  # the dtype the source model declares; float32 where none (or another)
            declared = str(AutoConfig.from_pretrained(self.cfg.model).dtype).replace("torch.", "")
            dtype = declared if declared in ("bfloat16", "float16") else "float32"
        state = self.full_state(dtype)
        if self.rank != 0:
            return None
        return write_hf_folder(state, self.cfg.model, out_dir, dtype, extra_files)

    def publish(self, engines: list[Any], version: int, config: Any = None) -> dict[str, Any] | None:
        """Full weights to engine actors by `config`'s route (a PublishConfig); every rank calls."""
        from rose_ray.publish.publisher import WeightPublisher
        from rose_ray.publish.route import PublishConfig

        start = time.perf_counter()
        config = config or PublishConfig()
        if self.rank == 0 and (self._publisher is None or self._publisher.config != config):
            self._publisher = WeightPublisher(config)
        state = self.full_state(device=self._publisher.state_device(engines) if self.rank == 0 else "cpu")
        if self.rank != 0:
            return None
        gathered = time.perf_counter()
        out = self._publisher.publish(state, engines, version)
        out["gather_ms"] = (gathered - start) * 1e3
        out["total_ms"] = (time.perf_counter() - start) * 1e3
        return out
