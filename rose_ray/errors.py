"""Errors that mean bad input (a config key, a data line, a CLI argument): the CLI prints an
`InputError`'s one line and exits 2. Anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

from typing import Any


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


def at_least(section: Any, prefix: str, minimum: float, *keys: str, above: bool = False) -> None:
    """A ConfigError naming the first of the section's `keys` below `minimum` (`above`: not above it)."""
    for key in keys:
        value = getattr(section, key)
        if not (value > minimum if above else value >= minimum):  # NaN is neither
            raise ConfigError(f"{prefix}{key}: must be {'>' if above else '>='} {minimum}, got {value!r}")


def first_line(e: BaseException, named: bool = False) -> str:
    """An error's first line (`named`: after its type, cut at 200 characters); its type without one."""
    text = str(e).strip()
    line = text.splitlines()[0] if text else ""
    return (f"{type(e).__name__}: {line[:200]}" if named else line) if line else type(e).__name__
