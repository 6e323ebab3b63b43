"""Loading pickle-based dumps (torch `.pt`, pickled verl DataProto) through an allow-list, only with consent.

Pickle runs code named inside the file when it is loaded, so rcdiag refuses pickle formats unless the user passes
`--allow-pickle`. Even then loading goes through a restricted unpickler: only containers, tensors, numpy arrays and
a few known framework classes resolve; a framework class that may not be importable here (verl's `DataProto`, a
`TensorDict`, slime's `Sample`) becomes a plain attribute container, so the framework need not be installed.
"""
from __future__ import annotations

import io
import pickle
from pathlib import Path
from typing import Any

from rcdiag.errors import InputError

PICKLE_WHY = ("pickle-based files execute arbitrary code named inside them when loaded, so a dump from an "
              "untrusted source can take over this machine")


class PlainContainer:
    """Stands in for a framework class (verl DataProto, TensorDict): keeps the pickled state as attributes."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._args = args
        self.__dict__.update(kwargs)

    def __setstate__(self, state: Any) -> None:
        if isinstance(state, tuple) and len(state) == 2 and isinstance(state[1], dict):  # (dict, slots) form
            state = {**(state[0] or {}), **state[1]}
        if isinstance(state, dict):
            self.__dict__.update(state)
        else:
            self._state = state

    def __repr__(self) -> str:
        return f"PlainContainer({sorted(self.__dict__)})"


def _enum_value(value: Any) -> Any:
    """Stands in for a framework Enum class (slime's Sample.Status): unpickling calls it with the member's value."""
    return value


_NESTED = {"Status": _enum_value, "SpecInfo": PlainContainer, "PrefixCacheInfo": PlainContainer}


def _nested_getattr(owner: Any, name: str) -> Any:
    """Protocol-2 pickles reach nested classes (Sample.Status) through getattr; only these few resolve — a general
    getattr would let a crafted file walk from an allowed object to arbitrary code."""
    if owner is PlainContainer and name in _NESTED:
        return _NESTED[name]
    raise InputError(f"the dump asks for attribute {name!r} of {getattr(owner, '__name__', type(owner).__name__)}, "
                     "which rcdiag does not resolve")


_MAPPED: dict[tuple[str, str], Any] = {
    ("builtins", "getattr"): _nested_getattr, ("__builtin__", "getattr"): _nested_getattr,
    ("verl.protocol", "DataProto"): PlainContainer, ("verl.protocol", "DataProtoItem"): PlainContainer,
    ("tensordict._td", "TensorDict"): PlainContainer, ("tensordict.tensordict", "TensorDict"): PlainContainer,
    **{(f"{fw}.utils.types", name): PlainContainer for fw in ("slime", "miles")
       for name in ("Sample", "Sample.SpecInfo", "Sample.PrefixCacheInfo")},
    **{(f"{fw}.utils.types", "Sample.Status"): _enum_value for fw in ("slime", "miles")},
}
_BUILTINS = {"dict", "list", "tuple", "set", "frozenset", "str", "int", "float", "bool", "complex", "bytes",
             "bytearray", "slice", "range"}
_NUMPY_MODULES = {"numpy", "numpy.core.multiarray", "numpy._core.multiarray", "numpy.dtypes"}
_NUMPY_NAMES = {"_reconstruct", "ndarray", "dtype", "scalar"}


def require_consent(path: Path, fmt: str, allow_pickle: bool) -> None:
    """Raise InputError unless the user allowed pickle loading for this format."""
    if not allow_pickle:
        raise InputError(f"the '{fmt}' format is pickle-based and {PICKLE_WHY}", file=str(path),
                         hint="if you trust this file, re-run with --allow-pickle")


def _load_storage_bytes(data: bytes) -> Any:
    """Safe twin of torch.storage._load_from_bytes: the inner storage pickle loads with weights_only."""
    import torch

    return torch.load(io.BytesIO(data), weights_only=True)


def _torch_global(name: str) -> Any:
    import torch

    value = getattr(torch, name, None)
    if isinstance(value, torch.dtype) or name in {"Size", "device"} or name.endswith("Storage"):
        return value
    return None


def _resolve(module: str, name: str) -> Any:
    """The object a pickle global may resolve to, or None when it is not on the allow-list."""
    if (module, name) in _MAPPED:
        return _MAPPED[(module, name)]
    if module == "builtins" and name in _BUILTINS:
        return getattr(__import__("builtins"), name)
    if module == "collections" and name in {"OrderedDict", "defaultdict", "deque"}:
        return getattr(__import__("collections"), name)
    if module == "torch._utils" and name in {"_rebuild_tensor_v2", "_rebuild_tensor", "_rebuild_parameter"}:
        import torch._utils

        return getattr(torch._utils, name)
    if module == "torch.storage" and name == "_load_from_bytes":
        return _load_storage_bytes
    if module == "torch":
        return _torch_global(name)
    if module in _NUMPY_MODULES and (name in _NUMPY_NAMES or name.endswith("DType")):
        import importlib

        return getattr(importlib.import_module(module), name, None)
    return None


class RestrictedUnpickler(pickle.Unpickler):
    """An Unpickler that resolves only allow-listed globals (see module docstring)."""

    source = "<pickle>"

    def find_class(self, module: str, name: str) -> Any:
        value = _resolve(module, name)
        if value is None:
            raise InputError(f"the dump references {module}.{name}, which rcdiag does not load (it only loads "
                             "containers, tensors, numpy arrays and known framework classes)", file=self.source,
                             hint="export the fields you need to Parquet/JSONL and use `rcdiag import parquet`")
        return value


class _RestrictedPickleModule:
    """A `pickle_module` for torch.load whose Unpickler is restricted."""

    Unpickler = RestrictedUnpickler
    load = staticmethod(pickle.load)
    __name__ = "rcdiag_restricted_pickle"


def load_pickle_file(path: Path) -> Any:
    """Load a torch.save (zip) or plain pickle file through the restricted unpickler; InputError if unreadable."""
    import torch

    RestrictedUnpickler.source = str(path)
    try:
        with open(path, "rb") as handle:
            head = handle.read(4)
            handle.seek(0)
            if head.startswith(b"PK"):
                return torch.load(handle, map_location="cpu", weights_only=False,
                                  pickle_module=_RestrictedPickleModule)
            return RestrictedUnpickler(handle).load()
    except InputError as exc:
        if exc.file is None:
            raise InputError(str(exc), file=str(path)) from None
        raise
    except FileNotFoundError:
        raise InputError("no such file", file=str(path)) from None
    except (pickle.UnpicklingError, EOFError, RuntimeError, ValueError, TypeError, AttributeError) as exc:
        raise InputError(f"cannot read the dump ({type(exc).__name__}: {exc})", file=str(path),
                         hint="is it complete? a dump cut short by a crash cannot be loaded") from None
