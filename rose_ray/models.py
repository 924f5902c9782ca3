"""Load real Hugging Face models: a local folder, or a hub id from the local cache (downloaded
by a command's driver). The tiny local models: provision/tiny.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rose_ray.errors import InputError


class ModelNotAvailable(RuntimeError):
    """A model or tokenizer that is neither a local folder nor in the local hub cache."""


def hub_cache() -> str:
    """The Hugging Face cache's hub folder the client uses (`$HF_HOME/hub`, or `HF_HUB_CACHE`)."""
    from huggingface_hub import constants

    return constants.HF_HUB_CACHE


def download_command(name: str) -> str:
    """The command that puts `name` into this process's Hugging Face cache."""
    return f"hf download {name} --cache-dir {hub_cache()}"


def _offline_hint(name: str, err: Exception) -> ModelNotAvailable:
    return ModelNotAvailable(
        f"model {name!r} is not available: it is not a local folder and could not be loaded "
        f"from the Hugging Face cache ({type(err).__name__}: {err}). Pass a local path, "
        f"download it where the hub is reachable (`{download_command(name)}`), or run "
        "`rose-ray init-tiny --out DIR` for tiny local models."
    )


def is_hub_id(name: str) -> bool:
    """A model name that is neither a local folder nor a `tiny:` name and has a hub id's form
    (`name` or `org/name`). A missing path (`/data/model`, `./model`, `~/model`) is not one."""
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    if name.startswith(("tiny:", ".", "~")) or Path(name).expanduser().is_dir():
        return False
    try:
        validate_repo_id(name)
    except HFValidationError:
        return False
    return True


def local_model(name: str | Path) -> str:
    """The folder a model name stands for: a local folder, or a hub id's snapshot in the local
    Hugging Face cache (nothing is downloaded: `download_model` does that); else ModelNotAvailable."""
    path = Path(name).expanduser()
    if path.is_dir():
        return str(path)
    from huggingface_hub import snapshot_download

    try:
        return snapshot_download(str(name), local_files_only=True)
    except Exception as e:  # noqa: BLE001 - not a repo id, or not in the cache: say which model
        raise _offline_hint(str(name), e) from e


def model_folder(name: str, tiny_dir: str, stand_ins: dict[str, str]) -> str | None:
    """The folder of model `name`: its stand-in (`--tokenizer-for`, `--model-config-for`), the tiny
    models', a local folder or a hub id's snapshot in the local cache; None when it is none."""
    if name in stand_ins:
        return stand_ins[name]
    if name.startswith("tiny:"):
        from rose_ray.provision.tiny import resolve_tiny

        return resolve_tiny(name, tiny_dir)
    try:
        return local_model(name)
    except ModelNotAvailable:
        return None


def download_model(name: str, label: str) -> str:
    """`local_model` for a command's driver, before any actor starts: a hub id is downloaded into
    the Hugging Face cache first, with progress bars on stderr (with HF_HUB_OFFLINE set, a model not
    in the cache is a ModelNotAvailable naming the command that downloads it)."""
    if not is_hub_id(name):
        return local_model(name)
    from huggingface_hub import constants, snapshot_download, utils

    cached = model_folder(name, "", {})  # a hub id's snapshot in the cache, else None: downloaded below
    if constants.HF_HUB_OFFLINE:
        if cached is None:
            raise ModelNotAvailable(
                f"model {name!r} is not in the Hugging Face cache ({hub_cache()}) and HF_HUB_OFFLINE is set, "
                f"so it is not downloaded: download it where the hub is reachable (`{download_command(name)}`, "
                "into the cache every node reads), or unset HF_HUB_OFFLINE")
        return cached
    where = f"{constants.ENDPOINT} into {hub_cache()}"
    print(f"{label}: {name}: " + (f"in the Hugging Face cache; checking it against {constants.ENDPOINT}"
                                   if cached else f"downloading from {where}"), flush=True)
    # transformers turns the client's progress bars off when it loads a model; a user's
    # HF_HUB_DISABLE_PROGRESS_BARS=1 keeps them off.
    turn_on = utils.are_progress_bars_disabled() and constants.HF_HUB_DISABLE_PROGRESS_BARS is not True
    if turn_on:
        utils.enable_progress_bars()
    try:
        folder = snapshot_download(name)
    except Exception as e:  # noqa: BLE001 - a wrong id, no access, no network: one line naming the model
        reason = " ".join(line.strip() for line in str(e).splitlines()[:2] if line.strip())
        raise ModelNotAvailable(
            f"model {name!r} could not be downloaded from {where} ({type(e).__name__}: {reason}): check "
            "the id and your access (a gated model needs `hf auth login` or HF_TOKEN), or download it "
            f"beforehand (`{download_command(name)}`) and set HF_HUB_OFFLINE=1") from e
    finally:
        if turn_on:
            utils.disable_progress_bars()
    files = [p for p in Path(folder).rglob("*") if p.is_file()]
    size = sum(p.stat().st_size for p in files)
    shown = f"{size / 2**30:.1f} GiB" if size >= 2**30 else f"{size / 2**20:.1f} MiB"
    print(f"{label}: {name}: {folder} ({len(files)} files, {shown})", flush=True)
    return folder


def quiet_transformers() -> None:
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # per-shard bars drown the run's own progress line


def load_tokenizer(name_or_path: str | Path) -> Any:
    from transformers import AutoTokenizer

    try:
        tok = AutoTokenizer.from_pretrained(local_model(name_or_path))
    except (OSError, ValueError) as e:
        raise _offline_hint(str(name_or_path), e) from e
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    return tok


def load_model(name_or_path: str | Path, dtype: str = "float32", device: str = "cpu") -> Any:
    """A causal LM in eval mode. `dtype`: float32, bfloat16, float16 or auto."""
    import torch
    from transformers import AutoModelForCausalLM

    quiet_transformers()
    torch_dtype = "auto" if dtype == "auto" else getattr(torch, dtype, None)
    if torch_dtype is None:
        raise InputError(f"dtype must be float32, bfloat16, float16 or auto, not {dtype!r}")
    try:
        model = AutoModelForCausalLM.from_pretrained(local_model(name_or_path), dtype=torch_dtype)
    except (OSError, ValueError) as e:
        raise _offline_hint(str(name_or_path), e) from e
    return model.to(device).eval()


def count_parameters(model: Any) -> int:
    return sum(p.numel() for p in model.parameters())
