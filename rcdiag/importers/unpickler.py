"""The restricted unpickler behind `--allow-pickle`: the few globals a dump may name, each checked so that it can
neither run code, nor read memory outside what the file holds, nor allocate a size written in the file.

* Containers, tensors (rebuilt by `rcdiag.importers.tensors`, the one bounds-checked rebuilder), numpy arrays and a
  few framework classes; a framework class that may not be importable here (verl's `DataProto`, a `TensorDict`,
  slime's `Sample`) becomes a plain attribute container, so the framework need not be installed.
* numpy dtypes only as numpy itself pickles a plain one: numbers, fixed-width text, and object arrays whose
  elements are the objects pickled with them (`rcdiag.importers.numpystate`).
* No allow-listed callable takes a size from the file: `bytearray(2**62)`, `list(range(4e8))` (range itself is not
  resolved), `torch.FloatStorage(n)`, `numpy.ndarray(shape)` are refused, array states are checked against the
  bytes they carry, and every storage read is charged to a Budget bounded by the file's size.
"""
from __future__ import annotations

import collections
import functools
import pickle
from collections.abc import Callable
from typing import Any, BinaryIO

import numpy as np

from rcdiag.errors import InputError
from rcdiag.importers import tensors as tensor_views
from rcdiag.importers.numpystate import (
    NUMPY_MODULES,
    CheckedArray,
    PickledDtype,
    checked_reconstruct,
    checked_scalar,
    refuse_size,
)
from rcdiag.importers.tensors import STORAGE_TYPES, StorageType, TorchType, rebuild


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
        return f"PlainContainer({sorted(map(str, self.__dict__))})"


def _enum_value(value: Any) -> Any:
    """Stands in for a framework Enum class (slime's Sample.Status): unpickling calls it with the member's value."""
    return value


_NESTED = {"Status": _enum_value, "SpecInfo": PlainContainer, "PrefixCacheInfo": PlainContainer}


def _nested_getattr(owner: Any, name: Any) -> Any:
    """Protocol-2 pickles reach nested classes (Sample.Status) through getattr; only these few resolve — a general
    getattr would let a crafted file walk from an allowed object to arbitrary code."""
    if owner is PlainContainer and name in _NESTED:
        return _NESTED[name]
    raise InputError(f"the dump asks for attribute {str(name)[:60]!r} of "
                     f"{getattr(owner, '__name__', type(owner).__name__)}, which rcdiag does not resolve")


class Budget:
    """Bytes a load may allocate for what it reads (archive members, storages), charged as they are read: a file
    whose members overlap, or that refers to the same stored bytes again and again, stops at `limit`."""

    def __init__(self, limit: int) -> None:
        self.limit, self.used = limit, 0

    def charge(self, nbytes: int, what: str) -> None:
        self.used += nbytes
        if self.used > self.limit:
            raise InputError(f"reading {what} would take the bytes read past {self.limit}, more than the file "
                             "holds: its parts overlap or are referenced more than once")


# --- builtins that cannot be sized by the file ------------------------------------------------------------------

_MATERIALIZED = (str, bytes, bytearray, list, tuple, dict, set, frozenset, collections.deque, np.ndarray)
SCALARS = (bool, int, float, complex, type(None))


def _guarded(cls: type) -> Callable[..., Any]:
    """`cls(*args)` only from data already unpickled (so already paid for by the file's bytes): no count such as
    `bytearray(2**62)` and no lazy iterable."""

    def build(*args: Any, **kwargs: Any) -> Any:
        for arg in (*args, *kwargs.values()):
            if cls in (bytes, bytearray) and isinstance(arg, int):
                raise refuse_size(f"{cls.__name__}({arg})")
            if cls is collections.defaultdict and (arg is None or callable(arg)):
                continue
            if not isinstance(arg, _MATERIALIZED + SCALARS):
                raise refuse_size(f"{cls.__name__}() of a {type(arg).__name__}")
        return cls(*args, **kwargs)

    build.__name__ = build.__qualname__ = cls.__name__
    return build


_BUILTINS = {name: _guarded(getattr(__import__("builtins"), name))
             for name in ("dict", "list", "tuple", "set", "frozenset", "str", "int", "float", "bool", "complex",
                          "bytes", "bytearray")}
_BUILTINS["slice"] = slice
_COLLECTIONS = {name: _guarded(getattr(collections, name)) for name in ("OrderedDict", "defaultdict", "deque")}


def plain_values(obj: Any, memo: dict[int, Any] | None = None) -> Any:
    """`obj` with every CheckedArray replaced by a plain ndarray view and every PickledDtype by its numpy dtype, in
    place where containers are mutable."""
    memo = {} if memo is None else memo
    if isinstance(obj, SCALARS + (str, bytes)):
        return obj
    if id(obj) in memo:
        return memo[id(obj)]
    memo[id(obj)] = obj
    if isinstance(obj, PickledDtype):
        memo[id(obj)] = obj.dtype
        return obj.dtype
    if isinstance(obj, CheckedArray):
        out = memo[id(obj)] = obj.view(np.ndarray)
        if out.dtype.hasobject:
            for index in np.ndindex(out.shape):
                item = out[index]
                new = plain_values(item, memo)
                if new is not item:
                    out[index] = new
        return out
    if isinstance(obj, dict):
        for key, value in obj.items():
            obj[key] = plain_values(value, memo)
    elif isinstance(obj, list):
        obj[:] = [plain_values(item, memo) for item in obj]
    elif isinstance(obj, collections.deque):
        items = [plain_values(item, memo) for item in obj]
        obj.clear()
        obj.extend(items)
    elif isinstance(obj, tuple):
        items = tuple(plain_values(item, memo) for item in obj)
        if any(a is not b for a, b in zip(items, obj, strict=True)):
            memo[id(obj)] = items
            return items
    elif isinstance(obj, PlainContainer):
        for key, value in vars(obj).items():
            setattr(obj, key, plain_values(value, memo))
    return obj


# --- torch: tensors over storages read from the file --------------------------------------------------------------

def _rebuild_v2(storage: Any, storage_offset: Any, size: Any, stride: Any, requires_grad: Any = False,
                backward_hooks: Any = None, metadata: Any = None, *, numpy: bool) -> Any:
    """Our `torch._utils._rebuild_tensor_v2` (hooks and metadata dropped)."""
    tensor = rebuild(storage, storage_offset, size, stride, numpy=numpy)
    if requires_grad is True and not numpy and tensor.is_floating_point():
        tensor.requires_grad_(True)
    return tensor


def _rebuild_v1(storage: Any, storage_offset: Any, size: Any, stride: Any, *, numpy: bool) -> Any:
    """Our `torch._utils._rebuild_tensor` (older pickles)."""
    return rebuild(storage, storage_offset, size, stride, numpy=numpy)


def _rebuild_v3(storage: Any, storage_offset: Any, size: Any, stride: Any, requires_grad: Any,
                backward_hooks: Any, dtype: Any, metadata: Any = None, *, numpy: bool) -> Any:
    """Our `torch._utils._rebuild_tensor_v3`: dtypes without a typed storage (uint16, float8…) name their dtype."""
    return rebuild(storage, storage_offset, size, stride, dtype, numpy=numpy)


def _rebuild_parameter(data: Any, requires_grad: Any, backward_hooks: Any, *, numpy: bool) -> Any:
    """Our `torch._utils._rebuild_parameter`: an nn.Parameter over a tensor rebuilt above (the array itself when
    reading without torch)."""
    if numpy:
        if not isinstance(data, np.ndarray):
            raise InputError(f"a parameter's data is a {type(data).__name__}, not a tensor")
        return data
    import torch

    if not isinstance(data, torch.Tensor):
        raise InputError(f"a parameter's data is a {type(data).__name__}, not a tensor")
    return torch.nn.Parameter(data, requires_grad=requires_grad is True and data.is_floating_point())


def _torch_size(*args: Any, numpy: bool) -> Any:
    if len(args) != 1:
        raise InputError("torch.Size takes one tuple of sizes")
    size = tensor_views.dims(args[0], "torch.Size")
    if numpy:
        return size
    import torch

    return torch.Size(size)


def _torch_device(*args: Any, numpy: bool) -> Any:
    if not all(isinstance(arg, (str, int)) and not isinstance(arg, bool) for arg in args) or len(args) > 2:
        raise InputError("torch.device takes a device name and index")
    if numpy:
        return ":".join(map(str, args))
    import torch

    return torch.device(*args)


def _torch_global(name: str, numpy: bool) -> Any:
    if name in STORAGE_TYPES:
        return StorageType(name)
    if name in ("Size", "device"):
        return functools.partial(_torch_size if name == "Size" else _torch_device, numpy=numpy)
    if name in tensor_views.ITEMSIZE:
        if numpy:
            return TorchType(name)
        import torch

        return getattr(torch, name)
    return None


_MAPPED: dict[tuple[str, str], Any] = {
    ("builtins", "getattr"): _nested_getattr, ("__builtin__", "getattr"): _nested_getattr,
    ("verl.protocol", "DataProto"): PlainContainer, ("verl.protocol", "DataProtoItem"): PlainContainer,
    ("tensordict._td", "TensorDict"): PlainContainer, ("tensordict.tensordict", "TensorDict"): PlainContainer,
    **{(f"{fw}.utils.types", name): PlainContainer for fw in ("slime", "miles")
       for name in ("Sample", "Sample.SpecInfo", "Sample.PrefixCacheInfo")},
    **{(f"{fw}.utils.types", "Sample.Status"): _enum_value for fw in ("slime", "miles")},
    ("torch.storage", "UntypedStorage"): StorageType("UntypedStorage"),
    ("numpy", "dtype"): PickledDtype,
    **{(module, "_reconstruct"): checked_reconstruct for module in NUMPY_MODULES},
    **{(module, "scalar"): checked_scalar for module in NUMPY_MODULES},
    **{(module, "ndarray"): CheckedArray for module in ("numpy", *NUMPY_MODULES)},
}
_REBUILDERS = {"_rebuild_tensor_v2": _rebuild_v2, "_rebuild_tensor_v3": _rebuild_v3, "_rebuild_tensor": _rebuild_v1,
               "_rebuild_parameter": _rebuild_parameter}


class RestrictedUnpickler(pickle.Unpickler):
    """An Unpickler that resolves only allow-listed globals (see the module docstring). `persistent_load`, when
    given, turns torch's storage references into storages read from the file; `storage_bytes` reads the torch.save
    bytes a plainly pickled tensor carries (`torch.storage._load_from_bytes`); `numpy`: tensors come out as numpy
    arrays (torch need not be installed); `budget`: what reading storages may allocate."""

    def __init__(self, file: BinaryIO, source: str = "<pickle>", *,
                 persistent_load: Callable[[Any], Any] | None = None,
                 storage_bytes: Callable[[Any], Any] | None = None, numpy: bool = False,
                 budget: Budget | None = None) -> None:
        super().__init__(file)
        self.source, self.numpy = source, numpy
        self.budget = budget if budget is not None else Budget(0)
        self._persistent_load, self._storage_bytes = persistent_load, storage_bytes

    def find_class(self, module: str, name: str) -> Any:
        value = self.resolve(module, name)
        if value is None:
            raise InputError(f"the dump references {module[:80]}.{name[:80]}, which rcdiag does not load (it only "
                             "loads containers, tensors, numpy arrays and known framework classes)", file=self.source,
                             hint="export the fields you need to Parquet/JSONL and use `rcdiag import parquet`")
        return value

    def resolve(self, module: str, name: str) -> Any:
        """The object a pickle global may resolve to, or None when it is not on the allow-list."""
        if (module, name) == ("torch.storage", "_load_from_bytes"):
            return self._storage_bytes
        if module == "torch._utils" and name in _REBUILDERS:
            return functools.partial(_REBUILDERS[name], numpy=self.numpy)
        if (module, name) in _MAPPED:
            return _MAPPED[(module, name)]
        if module in ("builtins", "__builtin__") and name in _BUILTINS:
            return _BUILTINS[name]
        if module == "collections" and name in _COLLECTIONS:
            return _COLLECTIONS[name]
        if module == "torch":
            return _torch_global(name, self.numpy)
        return None

    def persistent_load(self, pid: Any) -> Any:
        if self._persistent_load is None:
            raise InputError("the dump refers to an object stored outside its pickle, which a plain pickle cannot "
                             "hold")
        return self._persistent_load(pid)
