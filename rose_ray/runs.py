"""Versioned run folders: `runs/tiny/version_N/` a run, `runs/tiny/latest` a one-line file naming
the newest ("version_1"). N is claimed by an atomic `mkdir`, so two runs started at once never
share a folder. `latest` is a plain file, not a symlink: TensorBoard would show a linked run
twice, and some shared file systems have no symlinks.
"""

from __future__ import annotations

import os
from dataclasses import fields, is_dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rose_ray.errors import InputError
from rose_ray.files import write_file

VERSION = "version_"
LATEST = "latest"

if TYPE_CHECKING:
    from rose_ray.config import TrainConfig


def saved_config(cfg: Any) -> str:
    """A run's config.yaml: the config as given, each secret (a field its settings mark with
    registry.SECRET_ENV) replaced by a read of its environment variable, where --resume finds it
    again; a secret that was not set stays null. A key read from ROSE_RAY_API_KEY is saved as that,
    so it keeps the shared key's rule (openai.py endpoint_key)."""
    from omegaconf import DictConfig, ListConfig, OmegaConf

    from rose_ray.inference.registry import SECRET_ENV, SHARED_KEY_ENV

    conf = OmegaConf.structured(cfg)

    def redact(node: Any) -> None:
        if isinstance(node, DictConfig):
            kind = OmegaConf.get_type(node)
            secrets = {f.name: f.metadata[SECRET_ENV] for f in (fields(kind) if is_dataclass(kind) else ())
                       if SECRET_ENV in f.metadata}
            for key in list(node.keys()):
                if key in secrets and node[key] is not None:
                    env = secrets[key]
                    if not node.get(env):
                        node[env] = SHARED_KEY_ENV
                    node[key] = f"${{oc.env:{node[env]},null}}"
                else:
                    redact(node._get_node(key))
        elif isinstance(node, ListConfig):
            for item in node._iter_ex(resolve=False):
                redact(item)

    redact(conf)
    return OmegaConf.to_yaml(conf)


def new_version(parent: str | Path) -> Path:
    """A new, empty `parent/version_N` (N one past the highest there), named by `parent/latest`."""
    parent = Path(parent)
    parent.mkdir(parents=True, exist_ok=True)
    n = 1 + max((int(p.name[len(VERSION):]) for p in parent.glob(f"{VERSION}*")
                 if p.name[len(VERSION):].isdigit()), default=-1)
    while True:
        try:
            (parent / f"{VERSION}{n}").mkdir()
            break
        except FileExistsError:  # another run took N meanwhile
            n += 1
    write_file(parent / LATEST, f"{VERSION}{n}\n")  # readers see the old name or the new, never half of one
    return parent / f"{VERSION}{n}"


def resolve_run(path: str | Path) -> Path:
    """The run a path names: a run folder itself (any that holds config.yaml, those from before
    versioned folders too), or a folder of versioned runs or its `latest` file (`runs/tiny`,
    `runs/tiny/latest`), meaning the run `latest` names. Every command that takes a run folder
    (train --resume, export, eval --run) reads it here."""
    path = Path(path)
    if path.name == LATEST and path.is_file():
        path = path.parent
    if (path / "config.yaml").is_file():
        return path
    if (path / LATEST).is_file():
        run = path / (path / LATEST).read_text().strip()
        if (run / "config.yaml").is_file():
            return run
        raise InputError(f"{path}: its `{LATEST}` file names {run}, which holds no run (no config.yaml)")
    raise InputError(f"{path}: not a run directory (no config.yaml there, nor a `{LATEST}` file naming one)")


def keep_result(out: str | Path, text: str) -> Path:
    """Write a result file without losing the last: into a new `<out without suffix>/version_N/`
    under `out`'s name, and to `out` itself, the stable name of the latest. Returns that copy."""
    out = Path(out)
    kept = new_version(out.parent / out.stem) / out.name  # makes out's folder too
    write_file(kept, text)
    write_file(out, text)
    return kept


def train_config(config: str | Path | TrainConfig | None = None, overrides: list[str] | None = None,
                 resume: str | Path | None = None) -> tuple[TrainConfig, Path | None]:
    """The validated config a run would start with, and the folder of the run `resume` names
    (None for a fresh run: its folder is made when it starts)."""
    from rose_ray.config import load_config

    if not resume:
        return load_config(config, overrides), None
    if config is not None:
        raise InputError("--resume continues a run with its own config.yaml; give KEY=VALUE to change a setting, "
                         "not --config")
    try:
        run_dir = Path(os.path.abspath(resolve_run(resume)))  # absolute, as a fresh run's (fresh_run_dir)
    except InputError as e:
        raise InputError(f"--resume {e}") from None
    return load_config(run_dir / "config.yaml", overrides), run_dir


def fresh_run_dir(cfg: TrainConfig, named: bool) -> Path:
    """Where a fresh run goes: a new version under the config's run_dir; with `named` (run_dir=
    on the command line) that folder itself. A run already there is refused, never overwritten."""
    # Absolute: the learner's ranks write checkpoints and model/ from their own working directory.
    where = Path(os.path.abspath(Path(cfg.run_dir).expanduser()))
    for folder in (where, *where.parents):
        if folder.exists() and not folder.is_dir():
            raise InputError(f"run_dir {cfg.run_dir}: {folder} is a file, not a folder; give a folder for runs")
    if named:
        if (where / "checkpoints" / "latest").exists() or (where / LATEST).is_file():  # a run, or runs
            raise InputError(f"run_dir {where} already holds a run: continue it with --resume {where}, or "
                             "give another run_dir= (without run_dir=, each run gets a new version_N folder "
                             "under the config's run_dir)")
        from rose_ray.learner.export import check_model_out

        check_model_out(where / "model", overwrite=True, flag="run_dir")  # the run ends by writing it
    elif (where / "config.yaml").is_file():  # one run, not a folder of versions (an older layout)
        raise InputError(f"run_dir {where} holds a run itself (its config.yaml): continue it with --resume "
                         f"{where}, or move it away (mv {where} {where}_old) so that runs go to "
                         f"{where}/version_N, or give another name=")
    try:
        if named:
            where.mkdir(parents=True, exist_ok=True)
            return where
        return new_version(where)
    except OSError as e:  # no permission, a read-only file system
        raise InputError(f"run_dir {where}: cannot make a run folder there ({e.strerror or e})") from None
