"""Public names imported on first use (PEP 562), so that `import diagnose` and `diagnose --help` do
not pay for torch, scipy and pandas until a name that needs them is read."""

from __future__ import annotations

import sys
from importlib import import_module
from typing import Any, Callable


def lazy_names(package: str, homes: dict[str, str]) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The package's `__getattr__` and `__dir__` for `homes` (public name -> relative module that
    defines it, e.g. {"load_data": "._data"}); a name read once is cached in the package."""

    def __getattr__(name: str) -> Any:
        if name in homes:
            value = getattr(import_module(homes[name], package), name)
            setattr(sys.modules[package], name, value)  # later lookups skip this function
            return value
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    def __dir__() -> list[str]:
        return sorted(set(vars(sys.modules[package])) | set(homes))

    return __getattr__, __dir__
