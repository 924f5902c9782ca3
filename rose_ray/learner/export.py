"""Full weights out of a (possibly ZeRO-3-partitioned) model (`gather_state`: for a model folder
and for a publication), and a Hugging Face folder written from them, whole or not at all.
"""

from __future__ import annotations

import contextlib
import json
import shutil
from pathlib import Path
from typing import Any

from rose_ray.errors import InputError
from rose_ray.files import FOLDER_MARKER, is_empty_folder, out_path, writing_folder, written_here

WEIGHT_FILES = (".safetensors", ".bin", ".pt", ".pth", ".index.json")


def check_model_out(out: str | Path, overwrite: bool, flag: str = "--out", offers_overwrite: bool = True) -> None:
    """Refuse (InputError naming the path) to write a model folder over anything but nothing,
    an empty folder, or, with `overwrite`, a model folder rose_ray wrote. `out` as it will be
    written: symlinks resolved (`out_path`). `offers_overwrite`: the command has --overwrite."""
    target = out_path(out)
    if not target.exists() or is_empty_folder(target):
        return
    if not target.is_dir():
        raise InputError(f"{flag} {target}: a file is there, not a folder; give a new folder")
    if not overwrite:
        raise InputError(f"{flag} {target}: already exists and is not an empty folder; give a new one"
                         + (" (or --overwrite to replace a model folder rose-ray wrote)" if offers_overwrite else ""))
    if not written_here(target):
        raise InputError(f"{flag} {target}: not a model folder rose-ray wrote (it has no {FOLDER_MARKER}), so "
                         "--overwrite does not replace it; it is left as it is: give a new folder")


def gather_state(module: Any, zero3: bool, keep: bool, dtype: str | None = None,
                 device: Any = "cpu") -> dict[str, Any] | None:
    """{name: tensor on `device`} of unique parameters (cast to `dtype`) and persistent buffers;
    None where not `keep`. Under ZeRO-3 each parameter is gathered in turn (every rank calls)."""
    import deepspeed
    import torch

    cast = getattr(torch, dtype) if dtype else None
    state: dict[str, Any] = {}
    for name, param in module.named_parameters():  # tied parameters: first name only
        # ZeRO-3's gathered tensor is freed on leaving the context, so it is copied; else no copy on
        # its own device: callers read it before the next optimizer step.
        with (deepspeed.zero.GatheredParameters([param], modifier_rank=None) if zero3
              else contextlib.nullcontext()):
            if keep:
                value = param.detach().to(device, copy=zero3)
                state[name] = value.to(cast) if cast is not None else value
    if not keep:
        return None
    persistent = set(module.state_dict().keys())  # drops non-persistent buffers (inv_freq)
    for name, buf in module.named_buffers():
        if name in persistent:
            state[name] = buf.detach().to(device)
    return state


def write_hf_folder(state: dict[str, Any], model_path: str, out_dir: str, dtype: str,
                    extra_files: dict[str, str] | None = None) -> dict[str, Any]:
    """A Hugging Face folder (config, weights, tokenizer, generation config, `extra_files` and
    FOLDER_MARKER) written whole, replacing only an empty folder or a model folder rose_ray wrote."""
    from huggingface_hub import save_torch_state_dict
    from transformers import AutoConfig, AutoTokenizer, GenerationConfig

    out = out_path(out_dir)
    check_model_out(out, overwrite=True)
    with writing_folder(out, "--out") as tmp:
        src = Path(model_path)
        if src.is_dir():  # tokenizer, chat template, generation config: copied as they are
            for f in src.iterdir():
                if f.is_file() and f.name not in ("config.json", FOLDER_MARKER) and not f.name.endswith(WEIGHT_FILES):
                    shutil.copy2(f, tmp / f.name)
        else:
            AutoTokenizer.from_pretrained(model_path).save_pretrained(tmp)
            with contextlib.suppress(OSError):  # a model without a generation config
                GenerationConfig.from_pretrained(model_path).save_pretrained(tmp)
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
    mb = sum(v.numel() * v.element_size() for v in state.values()) / 2**20
    return {"path": str(out), "tensors": len(state), "mb": mb, "dtype": dtype}
