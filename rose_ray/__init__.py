"""rose_ray: online ROSE (student-then-teacher distillation) for ScienceWorld agents on Ray.

`rose_ray.train(...)` and `rose_ray.evaluate(...)` are the two commands as functions, inside a running
event loop too (docs/getting-started.md); each is its module, imported when first used: `import
rose_ray` alone loads no torch.
"""

from __future__ import annotations

import importlib
import sys
import types
from typing import Any

__version__ = "0.1.0"

API = ("train", "evaluate")


class _CallableModule(types.ModuleType):
    """A module that is also its main function (Python binds a submodule over a package attribute
    of its name, so the module itself takes the call)."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return getattr(self, self.__name__.rpartition(".")[2])(*args, **kwargs)


def callable_module(name: str) -> None:
    """Make module `name` (rose_ray.train, rose_ray.evaluate) callable as its function of the same name."""
    sys.modules[name].__class__ = _CallableModule


def __getattr__(name: str) -> Any:
    if name in API:  # imported when first used: `import rose_ray` stays light
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
