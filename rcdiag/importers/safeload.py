"""Loading pickle-based dumps (torch `.pt`, pickled verl DataProto) through an allow-list, only with consent.

Pickle runs code named inside the file when it is loaded, so rcdiag refuses pickle formats unless the user passes
`--allow-pickle`. Even then `--allow-pickle` is consent to read data, never to run code or to let the file size
rcdiag's memory:

* Nothing is ever handed to `torch.load` / `torch.jit.load`. torch.load switches to `torch.jit.load` when it sees
  a TorchScript archive (ignoring any restricted `pickle_module`), and a scripted `__setstate__` then runs. So the
  torch.save zip is opened here with `zipfile`: TorchScript archives (`code/`, `constants.pkl`) are refused, and
  `<archive>/data.pkl` is read by the restricted unpickler whose `persistent_load` builds each storage from the
  `<archive>/data/<key>` member's own bytes. The legacy (pre-1.6, non-zip) format is parsed the same way, both as a
  whole file and as the bytes a plainly pickled tensor carries (`torch.storage._load_from_bytes`).
* The restricted unpickler resolves only containers, tensors, numpy arrays and a few known framework classes; a
  framework class that may not be importable here (verl's `DataProto`, a `TensorDict`, slime's `Sample`) becomes a
  plain attribute container, so the framework need not be installed.
* No allow-listed callable takes a size from the file: `bytearray(2**62)`, `list(range(2**40))`,
  `torch.FloatStorage(n)`, `numpy.ndarray(shape)` are refused, and every storage, tensor extent and array state is
  checked against the bytes the file really holds before anything is allocated.
"""
from __future__ import annotations

import collections
import functools
import io
import math
import os
import pickle
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from rcdiag.errors import InputError

PICKLE_WHY = ("pickle-based files execute arbitrary code named inside them when loaded, so a dump from an "
              "untrusted source can take over this machine")
TORCHSCRIPT_WHY = ("it is a TorchScript archive (torch.jit.save: it holds code/ and constants.pkl), and rcdiag "
                   "refuses TorchScript archives: loading one runs the code inside it, even with --allow-pickle")
TORCHSCRIPT_HINT = "save the tensors themselves, e.g. torch.save(dict_of_tensors, path), or export them to Parquet"

_LEGACY_MAGIC = 0x1950A86A20F9469CFC6C  # torch.serialization.MAGIC_NUMBER, first pickle of a legacy torch.save
_LEGACY_PROTOCOL = 1001
_TORCHSCRIPT_FILES = {"constants.pkl", "bytecode.pkl", "attributes.pkl"}
_TORCHSCRIPT_DIRS = ("code/", "constants/")
_NPY_LIST_PICKLE = 0x02  # numpy dtype flag: the array's state is a list of objects, not raw bytes
_MAX_LIST_ITEMSIZE = 64  # an object array element may cost this many bytes per pickled list item, no more
_MAX_SCRATCH_BYTES = 64  # numpy's _reconstruct makes a placeholder (shape (0,)) that BUILD then fills

# torch.<Name>Storage -> the dtype (torch attribute name) its elements were saved as
_STORAGE_DTYPES = {
    "FloatStorage": "float32", "DoubleStorage": "float64", "HalfStorage": "float16", "BFloat16Storage": "bfloat16",
    "LongStorage": "int64", "IntStorage": "int32", "ShortStorage": "int16", "CharStorage": "int8",
    "ByteStorage": "uint8", "BoolStorage": "bool", "ComplexFloatStorage": "complex64",
    "ComplexDoubleStorage": "complex128", "UntypedStorage": "uint8",
}


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


# --- builtins that cannot be sized by the file ------------------------------------------------------------------

_MATERIALIZED = (str, bytes, bytearray, list, tuple, dict, set, frozenset, collections.deque, np.ndarray)
_SCALARS = (bool, int, float, complex, type(None))


def _refuse_size(what: str) -> InputError:
    return InputError(f"the dump asks for {what}, an allocation sized by a number written in the file; rcdiag only "
                      "builds objects from data the file actually holds")


def _guarded(cls: type) -> Callable[..., Any]:
    """`cls(*args)` only from data already unpickled (so already paid for by the file's bytes): no count such as
    `bytearray(2**62)` and no lazy iterable such as `list(range(2**40))`."""

    def build(*args: Any, **kwargs: Any) -> Any:
        for arg in (*args, *kwargs.values()):
            if cls in (bytes, bytearray) and isinstance(arg, int):
                raise _refuse_size(f"{cls.__name__}({arg})")
            if cls is collections.defaultdict and (arg is None or callable(arg)):
                continue
            if not isinstance(arg, _MATERIALIZED + _SCALARS):
                raise _refuse_size(f"{cls.__name__}() of a {type(arg).__name__}")
        return cls(*args, **kwargs)

    build.__name__ = build.__qualname__ = cls.__name__
    return build


_BUILTINS = {name: _guarded(getattr(__import__("builtins"), name))
             for name in ("dict", "list", "tuple", "set", "frozenset", "str", "int", "float", "bool", "complex",
                          "bytes", "bytearray")}
_BUILTINS.update(slice=slice, range=range)  # lazy, harmless on their own: the guarded constructors refuse range
_COLLECTIONS = {name: _guarded(getattr(collections, name)) for name in ("OrderedDict", "defaultdict", "deque")}


# --- numpy: arrays whose state is checked before numpy allocates -------------------------------------------------

class _CheckedArray(np.ndarray):
    """What `numpy.ndarray` resolves to while unpickling: numpy's own `__setstate__` allocates the shape written in
    the file before it looks at the data (and an object array whose list is too short crashes the interpreter), so
    the state is checked against the data first. `_plain_arrays` turns these back into plain ndarrays."""

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        raise _refuse_size("numpy.ndarray(...) called directly")

    def __setstate__(self, state: Any) -> None:
        if not isinstance(state, tuple) or len(state) not in (4, 5):
            raise InputError("a numpy array's pickled state is malformed")
        shape, dtype, rawdata = state[-4], state[-3], state[-1]
        if not isinstance(dtype, np.dtype):
            raise InputError("a numpy array's pickled state has no dtype")
        count = _count(shape, "numpy array shape")
        if dtype.flags & _NPY_LIST_PICKLE:
            if not isinstance(rawdata, list) or len(rawdata) != count:
                raise InputError(f"a numpy {dtype} array of shape {tuple(shape)} comes with "
                                 f"{len(rawdata) if isinstance(rawdata, list) else 'no list of'} elements")
            if dtype.itemsize > _MAX_LIST_ITEMSIZE:
                raise _refuse_size(f"a numpy array of {dtype.itemsize}-byte {dtype} elements")
        elif not isinstance(rawdata, (bytes, bytearray)) or len(rawdata) != count * dtype.itemsize:
            raise InputError(f"a numpy {dtype} array of shape {tuple(shape)} needs {count * dtype.itemsize} bytes, "
                             f"the file holds {len(rawdata) if isinstance(rawdata, (bytes, bytearray)) else 'none'}")
        np.ndarray.__setstate__(self, state)


def _count(shape: Any, what: str) -> int:
    """The element count of a shape from the file, refusing anything but a tuple/list of non-negative ints."""
    if not isinstance(shape, (tuple, list)) or not all(type(n) is int and n >= 0 for n in shape):
        raise InputError(f"{what} {shape!r} is not a list of non-negative integers")
    return math.prod(shape)


def _numpy_attr(name: str) -> Any:
    core = np._core if hasattr(np, "_core") else np.core  # numpy 2 moved numpy.core to numpy._core
    return getattr(core.multiarray, name)


def _checked_reconstruct(subtype: Any, shape: Any, dtype: Any) -> Any:
    """numpy's `_reconstruct` makes the empty placeholder array that BUILD then fills: a real shape here would be
    an allocation sized by the file."""
    if subtype is not _CheckedArray:
        raise InputError(f"the dump reconstructs a numpy array of type {getattr(subtype, '__name__', subtype)!r}")
    dtype = np.dtype(dtype)
    if _count(shape, "numpy array shape") * dtype.itemsize > _MAX_SCRATCH_BYTES:
        raise _refuse_size(f"a numpy placeholder array of shape {tuple(shape)} and dtype {dtype}")
    _ARRAYS_MADE[0] += 1
    return _numpy_attr("_reconstruct")(_CheckedArray, shape, dtype)


def _checked_scalar(dtype: Any, *args: Any) -> Any:
    """numpy's `scalar(dtype, bytes)`: the bytes must hold the value (object scalars carry the object itself)."""
    if not isinstance(dtype, np.dtype):
        raise InputError("a numpy scalar's pickled dtype is malformed")
    if not dtype.hasobject and (len(args) != 1 or not isinstance(args[0], bytes) or len(args[0]) < dtype.itemsize):
        raise InputError(f"a numpy {dtype} scalar comes without its {dtype.itemsize} bytes")
    return _numpy_attr("scalar")(dtype, *args)


_NUMPY_MODULES = {"numpy.core.multiarray", "numpy._core.multiarray"}
_ARRAYS_MADE = [0]  # _CheckedArrays made so far: a load that made none skips the _plain_arrays walk


def _plain_arrays(obj: Any, memo: dict[int, Any] | None = None) -> Any:
    """`obj` with every `_CheckedArray` replaced by a plain ndarray view, in place where containers are mutable."""
    memo = {} if memo is None else memo
    if isinstance(obj, _SCALARS + (str, bytes)):
        return obj
    if id(obj) in memo:
        return memo[id(obj)]
    memo[id(obj)] = obj
    if isinstance(obj, _CheckedArray):
        out = memo[id(obj)] = obj.view(np.ndarray)
        if out.dtype.hasobject and not out.dtype.fields:
            for index in np.ndindex(out.shape):
                item = out[index]
                new = _plain_arrays(item, memo)
                if new is not item:
                    out[index] = new
        return out
    if isinstance(obj, dict):
        for key, value in obj.items():
            obj[key] = _plain_arrays(value, memo)
    elif isinstance(obj, list):
        obj[:] = [_plain_arrays(item, memo) for item in obj]
    elif isinstance(obj, collections.deque):
        items = [_plain_arrays(item, memo) for item in obj]
        obj.clear()
        obj.extend(items)
    elif isinstance(obj, tuple):
        items = tuple(_plain_arrays(item, memo) for item in obj)
        if any(a is not b for a, b in zip(items, obj, strict=True)):
            memo[id(obj)] = items
            return items
    elif isinstance(obj, PlainContainer):
        for key, value in vars(obj).items():
            setattr(obj, key, _plain_arrays(value, memo))
    return obj


# --- torch: storages read from the file's bytes, tensors rebuilt over them -----------------------------------------

class _StorageType:
    """What a pickled `torch.<X>Storage` global resolves to: the element dtype of a storage the file holds — never
    the class itself, whose call (`torch.FloatStorage(2**40)`) would allocate a size written in the file."""

    def __init__(self, name: str, dtype_name: str) -> None:
        self.name, self.dtype_name = name, dtype_name

    @property
    def dtype(self) -> Any:
        import torch

        return getattr(torch, self.dtype_name)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise _refuse_size(f"torch.{self.name}(...)")


class _Storage:
    """A storage read from the file: its bytes as a 1-D uint8 tensor, and the dtype its elements were saved as."""

    __slots__ = ("raw", "dtype")

    def __init__(self, raw: Any, dtype: Any) -> None:
        self.raw, self.dtype = raw, dtype


def _bytes_tensor(buffer: bytearray) -> Any:
    """A uint8 tensor over `buffer`'s memory (no copy)."""
    import torch

    return torch.frombuffer(buffer, dtype=torch.uint8) if buffer else torch.empty(0, dtype=torch.uint8)


def _rebuild_tensor(storage: Any, storage_offset: Any, size: Any, stride: Any, requires_grad: Any = False,
                    backward_hooks: Any = None, metadata: Any = None, *, dtype: Any = None) -> Any:
    """Our `torch._utils._rebuild_tensor_v2`: a tensor viewing a storage read from the file, after checking that
    every element it reaches lies inside the bytes the file holds for that storage (hooks and metadata dropped)."""
    import torch

    if not isinstance(storage, _Storage):
        raise InputError(f"a tensor's storage is a {type(storage).__name__}, not a storage stored in the file")
    dtype = storage.dtype if dtype is None else dtype
    if not isinstance(dtype, torch.dtype):
        raise InputError(f"a tensor's dtype is a {type(dtype).__name__}")
    count = _count(size, "tensor size")
    _count(stride, "tensor stride")
    if type(storage_offset) is not int or storage_offset < 0 or len(size) != len(stride):
        raise InputError(f"tensor offset {storage_offset!r}, size {size!r} and stride {stride!r} do not fit together")
    available = storage.raw.numel() // dtype.itemsize
    needed = storage_offset + sum((n - 1) * s for n, s in zip(size, stride, strict=True)) + 1 if count else 0
    if needed > available:
        raise InputError(f"a {dtype} tensor of size {tuple(size)} reaches element {needed - 1} of a storage that "
                         f"holds {available}")
    tensor = torch.empty((0,), dtype=dtype)
    tensor.set_(storage.raw.untyped_storage(), storage_offset, tuple(size), tuple(stride))
    if requires_grad is True:
        tensor.requires_grad_(True)
    return tensor


def _rebuild_tensor_v1(storage: Any, storage_offset: Any, size: Any, stride: Any) -> Any:
    """Our `torch._utils._rebuild_tensor` (older pickles)."""
    return _rebuild_tensor(storage, storage_offset, size, stride)


def _rebuild_tensor_v3(storage: Any, storage_offset: Any, size: Any, stride: Any, requires_grad: Any,
                       backward_hooks: Any, dtype: Any, metadata: Any = None) -> Any:
    """Our `torch._utils._rebuild_tensor_v3`: dtypes without a typed storage (uint16, float8…) name their dtype."""
    return _rebuild_tensor(storage, storage_offset, size, stride, requires_grad, dtype=dtype)


def _rebuild_parameter(data: Any, requires_grad: Any, backward_hooks: Any) -> Any:
    """Our `torch._utils._rebuild_parameter`: an nn.Parameter over a tensor rebuilt above."""
    import torch

    if not isinstance(data, torch.Tensor):
        raise InputError(f"a parameter's data is a {type(data).__name__}, not a tensor")
    return torch.nn.Parameter(data, requires_grad=requires_grad is True)


def _torch_size(*args: Any) -> Any:
    import torch

    if len(args) != 1:
        raise InputError("torch.Size takes one tuple of sizes")
    _count(args[0], "torch.Size")
    return torch.Size(args[0])


def _torch_device(*args: Any) -> Any:
    import torch

    if not all(isinstance(arg, (str, int)) and not isinstance(arg, bool) for arg in args):
        raise InputError("torch.device takes a device name and index")
    return torch.device(*args)


def _torch_global(name: str) -> Any:
    import torch

    value = getattr(torch, name, None)
    if isinstance(value, torch.dtype):
        return value
    if name in _STORAGE_DTYPES:
        return _StorageType(name, _STORAGE_DTYPES[name])
    return {"Size": _torch_size, "device": _torch_device}.get(name)


_MAPPED: dict[tuple[str, str], Any] = {
    ("builtins", "getattr"): _nested_getattr, ("__builtin__", "getattr"): _nested_getattr,
    ("verl.protocol", "DataProto"): PlainContainer, ("verl.protocol", "DataProtoItem"): PlainContainer,
    ("tensordict._td", "TensorDict"): PlainContainer, ("tensordict.tensordict", "TensorDict"): PlainContainer,
    **{(f"{fw}.utils.types", name): PlainContainer for fw in ("slime", "miles")
       for name in ("Sample", "Sample.SpecInfo", "Sample.PrefixCacheInfo")},
    **{(f"{fw}.utils.types", "Sample.Status"): _enum_value for fw in ("slime", "miles")},
    ("torch._utils", "_rebuild_tensor_v2"): _rebuild_tensor,
    ("torch._utils", "_rebuild_tensor_v3"): _rebuild_tensor_v3,
    ("torch._utils", "_rebuild_tensor"): _rebuild_tensor_v1,
    ("torch._utils", "_rebuild_parameter"): _rebuild_parameter,
    ("torch.storage", "UntypedStorage"): _StorageType("UntypedStorage", "uint8"),
    **{(module, "_reconstruct"): _checked_reconstruct for module in _NUMPY_MODULES},
    **{(module, "scalar"): _checked_scalar for module in _NUMPY_MODULES},
    **{(module, "ndarray"): _CheckedArray for module in ("numpy", *_NUMPY_MODULES)},
}


def require_consent(path: Path, fmt: str, allow_pickle: bool) -> None:
    """Raise InputError unless the user allowed pickle loading for this format."""
    if not allow_pickle:
        raise InputError(f"the '{fmt}' format is pickle-based and {PICKLE_WHY}", file=str(path),
                         hint="if you trust this file, re-run with --allow-pickle")


def _resolve(module: str, name: str) -> Any:
    """The object a pickle global may resolve to, or None when it is not on the allow-list."""
    if (module, name) in _MAPPED:
        return _MAPPED[(module, name)]
    if module in ("builtins", "__builtin__") and name in _BUILTINS:
        return _BUILTINS[name]
    if module == "collections" and name in _COLLECTIONS:
        return _COLLECTIONS[name]
    if module == "torch":
        return _torch_global(name)
    if (module, name) == ("numpy", "dtype") or (module == "numpy.dtypes" and name.endswith("DType")):
        return getattr(np if module == "numpy" else np.dtypes, name, None)
    return None


class RestrictedUnpickler(pickle.Unpickler):
    """An Unpickler that resolves only allow-listed globals (see module docstring); `persistent_load`, when given,
    turns torch's storage references into storages read from the file."""

    def __init__(self, file: BinaryIO, source: str = "<pickle>",
                 persistent_load: Callable[[Any], Any] | None = None) -> None:
        super().__init__(file)
        self.source = source
        self._persistent_load = persistent_load

    def find_class(self, module: str, name: str) -> Any:
        if module == "torch.storage" and name == "_load_from_bytes":
            return functools.partial(_load_storage_bytes, source=self.source)
        value = _resolve(module, name)
        if value is None:
            raise InputError(f"the dump references {module}.{name}, which rcdiag does not load (it only loads "
                             "containers, tensors, numpy arrays and known framework classes)", file=self.source,
                             hint="export the fields you need to Parquet/JSONL and use `rcdiag import parquet`")
        return value

    def persistent_load(self, pid: Any) -> Any:
        if self._persistent_load is None:
            raise InputError("the dump refers to an object stored outside its pickle, which a plain pickle cannot "
                             "hold")
        return self._persistent_load(pid)


def _storage_pid(pid: Any, length: int) -> tuple[_StorageType, str, int]:
    """(storage type, key, element count) from torch's persistent id ('storage', type, key, location, numel[, view])."""
    if not isinstance(pid, tuple) or len(pid) != length or pid[0] != "storage":
        raise InputError(f"the dump refers to an outside object {str(pid)[:80]!r} that is not a torch storage")
    storage_type, key, numel = pid[1], pid[2], pid[4]
    if not isinstance(storage_type, _StorageType) or not isinstance(key, str) or type(numel) is not int or numel < 0:
        raise InputError(f"malformed torch storage reference {str(pid)[:80]!r}")
    return storage_type, key, numel


# --- the torch.save zip format -----------------------------------------------------------------------------------

def _read_member(archive: zipfile.ZipFile, info: zipfile.ZipInfo, archive_size: int) -> bytearray:
    """A member's bytes; only stored (uncompressed) members, as torch.save writes them, so that the size read can
    never exceed the archive's own size (a deflated member could inflate to any size)."""
    if info.compress_type != zipfile.ZIP_STORED:
        raise InputError(f"archive member {info.filename} is compressed; torch.save never compresses, and rcdiag "
                         "does not inflate members of a dump")
    if info.file_size != info.compress_size or info.file_size > archive_size:
        raise InputError(f"archive member {info.filename} claims {info.file_size} bytes, more than the archive holds")
    buffer = bytearray(info.file_size)
    with archive.open(info) as member:
        view, done = memoryview(buffer), 0
        while done < len(buffer):
            n = member.readinto(view[done:])
            if not n:
                raise InputError(f"archive member {info.filename} is cut short")
            done += n
    return buffer


def _load_zip(stream: BinaryIO, size: int, source: str) -> Any:
    """A torch.save zip: `<archive>/data.pkl` through the restricted unpickler, storages from `<archive>/data/<key>`;
    TorchScript archives refused before anything is read."""
    with zipfile.ZipFile(stream) as archive:
        infos = archive.infolist()
        if not infos or any("/" not in info.filename for info in infos) or \
                len({info.filename.split("/", 1)[0] for info in infos}) != 1:
            raise InputError("this zip file is not a torch.save archive (its members are not in one top folder)")
        members = {info.filename.split("/", 1)[1]: info for info in infos}
        if _TORCHSCRIPT_FILES & members.keys() or any(name.startswith(_TORCHSCRIPT_DIRS) for name in members):
            raise InputError(TORCHSCRIPT_WHY, hint=TORCHSCRIPT_HINT)
        if "data.pkl" not in members:
            raise InputError("this zip file is not a torch.save archive (no data.pkl)")
        if "byteorder" in members and bytes(_read_member(archive, members["byteorder"], size)) != b"little":
            raise InputError("the dump was saved on a big-endian machine, which rcdiag does not read")
        storages: dict[str, Any] = {}

        def persistent_load(pid: Any) -> _Storage:
            storage_type, key, numel = _storage_pid(pid, 5)
            if key not in storages:
                info = members.get(f"data/{key}")
                if info is None:
                    raise InputError(f"storage {key!r} is missing from the archive")
                storages[key] = _bytes_tensor(_read_member(archive, info, size))
            raw, dtype = storages[key], storage_type.dtype
            if numel * dtype.itemsize > raw.numel():
                raise InputError(f"storage {key!r} claims {numel} {dtype} elements ({numel * dtype.itemsize} bytes), "
                                 f"the archive holds {raw.numel()} bytes for it")
            return _Storage(raw[: numel * dtype.itemsize], dtype)

        data = _read_member(archive, members["data.pkl"], size)
        return RestrictedUnpickler(io.BytesIO(data), source, persistent_load).load()


# --- the legacy (pre-1.6) torch.save format, also inside plainly pickled tensors ---------------------------------

def _load_legacy(stream: BinaryIO, size: int, source: str) -> Any:
    """The rest of a legacy torch.save after its magic number: protocol, sys_info, the object pickle, the list of
    storage keys, then each storage as an int64 element count and its bytes. The object pickle comes first, so its
    storages are made empty up front — each checked to fit in the bytes that remain — and filled afterwards."""
    protocol = RestrictedUnpickler(stream, source).load()
    if protocol != _LEGACY_PROTOCOL:
        raise InputError(f"unknown legacy torch.save protocol {protocol!r}")
    sys_info = RestrictedUnpickler(stream, source).load()
    if not isinstance(sys_info, dict) or sys_info.get("little_endian") is not True:
        raise InputError("the dump was saved on a big-endian machine, which rcdiag does not read")
    storages: dict[str, _Storage] = {}
    budget = [size - stream.tell()]

    def persistent_load(pid: Any) -> _Storage:
        storage_type, key, numel = _storage_pid(pid, 6)
        if pid[5] is not None:
            raise InputError("the dump holds storage views of the pre-1.0 format, which rcdiag does not read")
        dtype = storage_type.dtype
        if key not in storages:
            nbytes = numel * dtype.itemsize
            if nbytes > budget[0]:
                raise InputError(f"storage {key!r} claims {numel} {dtype} elements ({nbytes} bytes), the file has "
                                 f"{budget[0]} bytes left")
            budget[0] -= nbytes
            storages[key] = _Storage(_bytes_tensor(bytearray(nbytes)), dtype)
        return _Storage(storages[key].raw, dtype)

    obj = RestrictedUnpickler(stream, source, persistent_load).load()
    keys = RestrictedUnpickler(stream, source).load()
    if not isinstance(keys, list) or not all(isinstance(key, str) for key in keys) or \
            sorted(keys) != sorted(storages):
        raise InputError("the dump's list of storages does not match the storages its data refers to")
    for key in keys:
        storage = storages[key]
        count = int.from_bytes(stream.read(8), "little", signed=True)
        if count * storage.dtype.itemsize != storage.raw.numel():
            raise InputError(f"storage {key!r} holds {count} elements, its reference said "
                             f"{storage.raw.numel() // storage.dtype.itemsize}")
        if storage.raw.numel() and stream.readinto(memoryview(storage.raw.numpy())) != storage.raw.numel():
            raise InputError(f"storage {key!r} is cut short")
    return obj


def _load_storage_bytes(data: Any, *, source: str) -> Any:
    """Our `torch.storage._load_from_bytes`: a plainly pickled tensor carries its storage as a legacy torch.save
    (or, if crafted, any torch.save) of the storage alone — parsed here, never handed to torch.load."""
    if not isinstance(data, (bytes, bytearray)):
        raise InputError(f"a pickled storage is a {type(data).__name__}, not bytes")
    stream = io.BytesIO(data)
    if data[:2] == b"PK":
        result = _load_zip(stream, len(data), source)
    elif RestrictedUnpickler(stream, source).load() == _LEGACY_MAGIC:
        result = _load_legacy(stream, len(data), source)
    else:
        raise InputError("a pickled storage is not a torch.save of a storage")
    if not isinstance(result, _Storage):
        raise InputError(f"a pickled storage holds a {type(result).__name__}, not a storage")
    return result


def load_pickle_file(path: Path) -> Any:
    """Load a torch.save file (zip or legacy) or a plain pickle through the restricted unpickler, without torch.load
    ever seeing it; InputError naming the file for anything it cannot or will not read."""
    source = str(path)
    arrays_before = _ARRAYS_MADE[0]
    try:
        with open(path, "rb") as handle:
            size = os.fstat(handle.fileno()).st_size
            if handle.read(2) == b"PK":
                handle.seek(0)
                result = _load_zip(handle, size, source)
            else:
                handle.seek(0)
                result = RestrictedUnpickler(handle, source).load()
                if type(result) is int and result == _LEGACY_MAGIC and handle.tell() < size:
                    result = _load_legacy(handle, size, source)
        return _plain_arrays(result) if _ARRAYS_MADE[0] != arrays_before else result
    except InputError as exc:
        if exc.file is None:
            raise InputError(str(exc), file=source) from None
        raise
    except (FileNotFoundError, IsADirectoryError):
        raise InputError("no such file", file=source) from None
    except MemoryError:
        raise InputError("the dump asks for more memory than this machine has", file=source,
                         hint="is it a real dump? rcdiag reads tensors, lists and dicts, nothing larger than the file"
                         ) from None
    except RecursionError:
        raise InputError("the dump nests deeper than rcdiag reads", file=source) from None
    except Exception as exc:  # noqa: BLE001 — anything a malformed or hostile file makes the parsers raise
        raise InputError(f"cannot read the dump ({type(exc).__name__}: {str(exc)[:300]})", file=source,
                         hint="is it complete? a dump cut short by a crash cannot be loaded") from None
