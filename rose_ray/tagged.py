"""Config sections that are one of several dataclasses chosen by a tag (prime-rl's discriminated
unions): the algorithm (`name`), rose's turn policy (`policy`), each engine's backend (`name`).
The rule over a config's layers: docs/configuration.md#algorithms-and-turn-policies.
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Mapping
from typing import Any, ClassVar

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from rose_ray.errors import ConfigError, first_line


class Tagged:
    """The base class of a family of kinds: `TAG` names the field that chooses the kind,
    `kinds()` maps each tag value to its dataclass (a family's base that sets `KINDS = {}` has
    each subclass register there under its tag's default)."""

    TAG: ClassVar[str] = "name"
    KINDS: ClassVar[dict[str, type] | None] = None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if cls.KINDS is not None and "KINDS" not in cls.__dict__:
            cls.KINDS[getattr(cls, cls.TAG)] = cls

    @classmethod
    def kinds(cls) -> Mapping[str, type]:
        return cls.KINDS or {}


def tagged(family: type[Tagged], default: str) -> Any:
    """A dataclass field holding a section of `family`, of kind `default` unless told."""
    return dataclasses.field(default_factory=lambda: {family.TAG: default}, metadata={"tagged": family})


def tagged_fields(cls: type, prefix: str = "") -> dict[str, type[Tagged]]:
    """The tagged sections of dataclass `cls` and of the sections it holds, by dotted key."""
    hints = typing.get_type_hints(cls)
    out: dict[str, type[Tagged]] = {}
    for f in dataclasses.fields(cls):
        if "tagged" in f.metadata:
            out[prefix + f.name] = f.metadata["tagged"]
        elif dataclasses.is_dataclass(hints[f.name]):
            out |= tagged_fields(hints[f.name], f"{prefix}{f.name}.")
    return out


def layered(family: type[Tagged], old: Any, new: Any) -> Any:
    """Section `new` (a layer's) over `old`: a kind other than old's starts afresh; a tagged
    section of the kind is layered by this same rule; any other key replaces old's."""
    tag = family.TAG
    old, new = (OmegaConf.to_container(v, resolve=True) if OmegaConf.is_config(v) else v for v in (old, new))
    new = {tag: new} if isinstance(new, str) else new
    if not isinstance(new, dict):
        return new  # `chosen` names it
    old = {tag: old} if isinstance(old, str) else old if isinstance(old, dict) else {}
    name = new.get(tag, old.get(tag))
    out = dict(old) if name == old.get(tag) else {}
    kind = family.kinds().get(name) if isinstance(name, str) else None
    inner = tagged_fields(kind) if dataclasses.is_dataclass(kind) else {}
    for key, value in new.items():
        out[key] = layered(inner[key], out.get(key), value) if key in inner else value
    return out


def chosen(family: type[Tagged], value: Any, key: str) -> Any:
    """The section `value` (a name, a mapping with the tag, or a kind's instance) as its kind's
    dataclass; a ConfigError naming `key` or `key.<field>` otherwise."""
    kinds, tag = family.kinds(), family.TAG
    if isinstance(value, tuple(kinds.values())):
        return value
    value = layered(family, None, value)  # as plain data, a bare name as {tag: name}
    if not isinstance(value, Mapping):
        raise ConfigError(f"{key}: expected a name or a mapping with {tag!r}, got {value!r}")
    name = value.get(tag)
    if name not in kinds:
        where = key if tag == "name" else f"{key}.{tag}"  # `algorithm: opd`, `handoff.policy: decay`
        raise ConfigError(f"{where}: must be one of {tuple(kinds)}, got {name!r}")
    kind = kinds[name]
    try:
        return OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(kind), value))
    except OmegaConfBaseException as e:
        where = f"{key}.{e.full_key}" if getattr(e, "full_key", None) else key
        why = (f"{name} has no such key (its keys: {', '.join(OmegaConf.structured(kind))})"
               if isinstance(e, KeyError) else first_line(e))  # KeyError: a key another kind has, or none
        raise ConfigError(f"{where}: {why}") from None


def over_layers(layers: list[Any], schema: Any) -> dict[str, Any]:
    """Each tagged section of `schema` (a structured config) over the layers, popped from them
    (OmegaConf would merge one kind's keys into another's), as its kind's dataclass."""
    sections = {}
    for key, family in tagged_fields(OmegaConf.get_type(schema)).items():
        parent, _, leaf = key.rpartition(".")
        section = OmegaConf.select(schema, key)
        for layer in layers:
            node = OmegaConf.select(layer, parent) if parent else layer
            if isinstance(node, DictConfig) and leaf in node:
                section = layered(family, section, node.pop(leaf))
        sections[key] = chosen(family, section, key)
    return sections
