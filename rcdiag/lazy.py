"""Lazy package faces: a package lists its public names and the module each lives in; a name's module is
imported on first use. `import rcdiag` and `rcdiag.analysis.defaults` then stay cheap (no numba, torch or
matplotlib until a name that needs them is used), and tab completion lists exactly the public names.
"""
from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def lazy_face(package: str, exports: Mapping[str, str]) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """(__getattr__, __dir__) for `package`, whose public names are `exports` (name → module path)."""

    def __getattr__(name: str) -> Any:
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(module), name)

    def __dir__() -> list[str]:
        return sorted(exports)

    return __getattr__, __dir__
