"""Full weights out of a (possibly ZeRO-3-partitioned) model: gather, export, publish.

Publication goes through the Ray object store: one `ray.put` of the state (numpy arrays
where numpy has the dtype, zero-copy reads on the same node; bfloat16 stays a tensor), then
each engine's `update_weights(state, version)`, which the engine actor queues behind the
calls already submitted. That is the engine contract: no process group shared with the
engines, and it works across nodes. bench/learner.py also times a gloo broadcast straight
into a receiver's parameters (~2.7x faster on a 100M model on CPU when measured: 0.57 vs
1.53 ms/MB); the engine actor has no method to receive one, so runs do not use it.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from typing import Any

import numpy as np

from rose_ray.errors import InputError
from rose_ray.files import is_empty_folder, swap_in, temp_sibling

DTYPES = {"float32": "float32", "bfloat16": "bfloat16", "float16": "float16"}
WEIGHT_FILES = (".safetensors", ".bin", ".pt", ".pth", ".index.json")
# Every model folder rose_ray writes holds this file: the only folders it will replace.
FOLDER_MARKER = "rose_ray_folder.json"
# Folders written before the marker existed hold one of these (a run's model/ and `export`'s
# provenance, a warm-up's record, `sft`'s log) next to their config.json.
OLDER_MARKERS = ("rose_ray_model.json", "rose_ray_warmup.json", "sft_log.jsonl")


def written_here(folder: str | Path) -> bool:
    """Whether `folder` is a model folder rose_ray wrote (so it may replace it)."""
    folder = Path(folder)
    return (folder / FOLDER_MARKER).is_file() or (
        (folder / "config.json").is_file() and any((folder / m).is_file() for m in OLDER_MARKERS))


def check_model_out(out: str | Path, overwrite: bool, flag: str = "--out") -> None:
    """Refuse (InputError naming the path) to write a model folder over anything but nothing,
    an empty folder, or, with `overwrite`, a model folder rose_ray wrote."""
    target = Path(out)
    if not target.exists() or is_empty_folder(target):
        return
    if not target.is_dir():
        raise InputError(f"{flag} {target}: a file is there, not a folder; give a new folder")
    if not overwrite:
        raise InputError(f"{flag} {target}: already exists and is not an empty folder; give a new one "
                         "(or --overwrite to replace a model folder rose-ray wrote)")
    if not written_here(target):
        raise InputError(f"{flag} {target}: not a model folder rose-ray wrote (it has no {FOLDER_MARKER}), so "
                         "--overwrite does not replace it; it is left as it is: give a new folder")


def _torch_dtype(name: str) -> Any:
    import torch

    return getattr(torch, name)


def gather_state(module: Any, zero3: bool, keep: bool, dtype: str | None = None) -> dict[str, Any] | None:
    """{name: cpu tensor} of unique parameters and persistent buffers; None where not `keep`.

    Under ZeRO-3 each parameter is gathered in turn (collective: every rank calls this), so
    peak memory is one full parameter, not the whole model.
    """
    import deepspeed

    cast = _torch_dtype(dtype) if dtype else None
    state: dict[str, Any] = {}
    for name, param in module.named_parameters():  # tied parameters: first name only
        if zero3:  # the gathered full tensor is freed on leaving the context: copy it
            with deepspeed.zero.GatheredParameters([param], modifier_rank=None):
                value = param.detach().to("cpu", copy=True) if keep else None
        else:  # no copy on CPU: callers read it before the next optimizer step
            value = param.detach().to("cpu") if keep else None
        if value is not None:
            state[name] = value.to(cast) if cast is not None else value
    if not keep:
        return None
    persistent = set(module.state_dict().keys())  # drops non-persistent buffers (inv_freq)
    for name, buf in module.named_buffers():
        if name in persistent:
            state[name] = buf.detach().to("cpu")
    return state


def source_dtype(model_path: str) -> str:
    """The dtype the source model's config declares (float32 when it declares none)."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(model_path)
    dtype = getattr(config, "dtype", None) or getattr(config, "torch_dtype", None)
    name = str(dtype).replace("torch.", "") if dtype is not None else "float32"
    return name if name in DTYPES else "float32"


def write_hf_folder(state: dict[str, Any], model_path: str, out_dir: str, dtype: str,
                    extra_files: dict[str, str] | None = None) -> dict[str, Any]:
    """A Hugging Face folder (config, model.safetensors, tokenizer with its chat template,
    generation config, `extra_files` {name: text} and FOLDER_MARKER) written atomically: built
    in a uniquely named sibling temp folder (removed if anything fails) and swapped in by
    rename-aside. What is at `out_dir` is replaced only when it is empty or a model folder
    rose_ray wrote (anything else: InputError, left as it is); commands that must not replace
    one at all check first (`check_model_out`)."""
    from huggingface_hub import save_torch_state_dict
    from transformers import AutoConfig, AutoTokenizer, GenerationConfig

    out = Path(out_dir)
    check_model_out(out, overwrite=True)
    tmp = temp_sibling(out)
    try:
        src = Path(model_path)
        if src.is_dir():  # tokenizer, chat template, generation config: copied as they are
            for f in src.iterdir():
                if f.is_file() and f.name != "config.json" and not f.name.endswith(WEIGHT_FILES):
                    shutil.copy2(f, tmp / f.name)
        else:
            AutoTokenizer.from_pretrained(model_path).save_pretrained(tmp)
            try:
                GenerationConfig.from_pretrained(model_path).save_pretrained(tmp)
            except OSError:
                pass  # a model without a generation config
        config = AutoConfig.from_pretrained(model_path)
        config.dtype = dtype
        config.save_pretrained(tmp)
        # ZeRO-1/2 keep parameters as views into one flat buffer (fp32 stays uncast): safetensors
        # refuses a tensor that does not cover its storage, so such a view is copied.
        state = {k: v if v.untyped_storage().nbytes() == v.numel() * v.element_size() else v.clone()
                 for k, v in state.items()}
        save_torch_state_dict(state, tmp, max_shard_size="5GB")
        for name, text in (extra_files or {}).items():
            (tmp / name).write_text(text)
        (tmp / FOLDER_MARKER).write_text(json.dumps({"written_by": "rose_ray", "dtype": dtype,
                                                     "tensors": len(state)}) + "\n")
        check_model_out(out, overwrite=True)  # again: something may have appeared there meanwhile
        swap_in(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    mb = sum(v.numel() * v.element_size() for v in state.values()) / 2**20
    return {"path": str(out), "tensors": len(state), "mb": mb, "dtype": dtype}


def to_wire(state: dict[str, Any]) -> dict[str, Any]:
    """numpy arrays where numpy has the dtype (zero-copy in the object store), else tensors."""
    import torch

    return {k: v.numpy() if v.dtype in (torch.float32, torch.float16) else v for k, v in state.items()}


def publish_state(state: dict[str, Any], engines: list[Any], version: int) -> dict[str, float]:
    """Put the weights in the object store once; every engine loads them; wait for all."""
    import ray

    start = time.perf_counter()
    wire = to_wire(state)
    ref = ray.put(wire)
    put = time.perf_counter()
    ray.get([e.update_weights.remote(ref, version) for e in engines])
    mb = sum(np.asarray(v).nbytes if isinstance(v, np.ndarray) else v.numel() * v.element_size()
             for v in wire.values()) / 2**20
    return {"mb": mb, "put_ms": (put - start) * 1e3, "send_ms": (time.perf_counter() - start) * 1e3,
            "engines": float(len(engines)), "version": float(version)}
