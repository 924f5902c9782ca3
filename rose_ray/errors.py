"""Errors that mean bad input, and typed config sections chosen by name.

`InputError` is bad input (a config key, a data line, a CLI argument): the CLI prints its one
line, which names the key or line, and exits 2. Anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException


class InputError(ValueError):
    """Bad input; the message names the key, line or value."""


class ConfigError(InputError):
    """A config that cannot run; the message names the key."""


class DataError(InputError):
    """A dataset row that does not follow the schema; the message names file:line and key."""

    @classmethod
    def at(cls, where: str, key: str, msg: str) -> DataError:
        return cls(f"{where}: {key}: {msg}")


class UnknownItem(InputError, KeyError):
    """A game, task or variation a catalogue does not have (a KeyError too, for lookups)."""


def chosen_section(kinds: Mapping[str, type], tag: str, value: Any, key: str) -> Any:
    """A config section that is one of several dataclasses, chosen by its `tag` field
    (`algorithm: {name: rose, ...}`, `handoff: {policy: decay, ...}`; a bare name stands for
    that kind's defaults). OmegaConf checks the keys and types; errors name `key.<field>`."""
    if isinstance(value, tuple(kinds.values())):
        return value
    if isinstance(value, DictConfig):
        value = OmegaConf.to_container(value, resolve=True)
    if isinstance(value, str):
        value = {tag: value}
    if not isinstance(value, Mapping):
        raise ConfigError(f"{key}: expected a name or a mapping with {tag!r}, got {value!r}")
    name = value.get(tag)
    if name not in kinds:
        where = key if tag == "name" else f"{key}.{tag}"  # `algorithm: opd`, `handoff.policy: decay`
        raise ConfigError(f"{where}: must be one of {tuple(kinds)}, got {name!r}")
    try:
        return OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(kinds[name]), value))
    except OmegaConfBaseException as e:
        where = f"{key}.{e.full_key}" if getattr(e, "full_key", None) else key
        first = str(e).strip().splitlines()[0]
        if isinstance(e, KeyError):  # a key another kind has, or none
            first = f"{name} has no such key (its keys: {', '.join(OmegaConf.structured(kinds[name]))})"
        raise ConfigError(f"{where}: {first}") from None
