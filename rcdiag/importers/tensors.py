"""The one bounds-checked tensor rebuilder of every pickle reader: a view of a storage the file holds is made only
after every element it reaches is checked to lie inside that storage's bytes.

A pickled tensor is (storage, offset, size, stride) with all four written by the file. Handed unchecked to
`as_strided` or `Tensor.set_`, a crafted offset or stride reads (or lets a later write reach) memory outside the
storage: a verl `gen_batch.dp` of 451 bytes crashed the interpreter, another imported the process heap as
log-probs. So every reader — torch.save zips and legacy files (`safeload`), the TensorDict bytes inside verl's
DataProto (`tensordicts`) — rebuilds tensors here, as torch tensors or, where torch need not be installed, numpy
arrays: sizes and strides non-negative integers (no negative strides), at most MAX_DIMS of them, the last element
reached inside the storage, and no more elements than the storage holds (an expanded, overlapping view would let a
few bytes stand for gigabytes once an importer copies it).
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np

from rcdiag.errors import InputError

MAX_DIMS = 64
"""More dimensions than any tensor of a dump has (torch itself allows 64)."""

ITEMSIZE = {
    "float32": 4, "float64": 8, "float16": 2, "bfloat16": 2, "complex64": 8, "complex128": 16,
    "int8": 1, "int16": 2, "int32": 4, "int64": 8, "uint8": 1, "uint16": 2, "uint32": 4, "uint64": 8, "bool": 1,
    "float8_e4m3fn": 1, "float8_e4m3fnuz": 1, "float8_e5m2": 1, "float8_e5m2fnuz": 1, "float8_e8m0fnu": 1,
}
"""The element types a dump's tensor may have (torch names) and their sizes: plain numbers only — no quantized,
bit-packed or sub-byte types."""

NUMPY_TYPES: dict[str, Any] = {name: np.dtype(name) for name in ITEMSIZE if hasattr(np, name) and name != "bool"}
NUMPY_TYPES["bool"] = np.dtype(np.bool_)
"""torch element type → numpy dtype where numpy has it (bfloat16 is widened to float32 instead; float8 has none)."""

STORAGE_TYPES = {
    "FloatStorage": "float32", "DoubleStorage": "float64", "HalfStorage": "float16", "BFloat16Storage": "bfloat16",
    "LongStorage": "int64", "IntStorage": "int32", "ShortStorage": "int16", "CharStorage": "int8",
    "ByteStorage": "uint8", "BoolStorage": "bool", "ComplexFloatStorage": "complex64",
    "ComplexDoubleStorage": "complex128", "UntypedStorage": "uint8",
}
"""torch.<Name>Storage → the element type its bytes were saved as."""


class StorageType:
    """What a pickled `torch.<X>Storage` global resolves to: the element type of a storage the file holds — never
    the class itself, whose call (`torch.FloatStorage(2**40)`) would allocate a size written in the file."""

    def __init__(self, name: str) -> None:
        self.name, self.dtype = name, STORAGE_TYPES[name]

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise InputError(f"the dump asks for torch.{self.name}(...), an allocation sized by a number written in "
                         "the file; rcdiag only builds objects from data the file actually holds")

    def __repr__(self) -> str:
        return f"torch.{self.name}"


class TorchType:
    """A torch dtype global (`torch.float32`) read without torch: its name (the numpy readers)."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return f"torch.{self.name}"


class Storage:
    """A storage read from the file: its bytes (a 1-D uint8 numpy array rcdiag allocated and filled from the file)
    and the element type they were saved as. `torch_bytes()` is the same memory as a torch tensor (made once, so
    the views of one storage share it as torch.load's do)."""

    __slots__ = ("raw", "dtype", "_torch")

    def __init__(self, raw: np.ndarray, dtype: str, torch_bytes: Any = None) -> None:
        self.raw, self.dtype, self._torch = raw, dtype, torch_bytes

    def typed(self, dtype: str) -> Storage:
        """The same bytes read as `dtype` (a storage referenced under another type)."""
        return Storage(self.raw, dtype, self._torch)

    def torch_bytes(self) -> Any:
        if self._torch is None:
            import torch

            self._torch = torch.from_numpy(self.raw)
        return self._torch


def type_name(dtype: Any) -> str:
    """The element type name of a dtype named in the file (a torch.dtype, a TorchType or a name), refusing any
    type outside ITEMSIZE."""
    if isinstance(dtype, TorchType):
        name = dtype.name
    elif isinstance(dtype, str):
        name = dtype.removeprefix("torch.")
    elif type(dtype).__module__ == "torch" and type(dtype).__name__ == "dtype":
        name = str(dtype).removeprefix("torch.")
    else:
        raise InputError(f"a tensor's element type is a {type(dtype).__name__}, not a dtype")
    if name not in ITEMSIZE:
        raise InputError(f"a tensor has element type {name[:40]!r}, which rcdiag does not read (plain integer, "
                         "float, complex and bool tensors only)")
    return name


def dims(value: Any, what: str) -> tuple[int, ...]:
    """A size or stride tuple from the file: at most MAX_DIMS non-negative ints (bools refused)."""
    if not isinstance(value, (tuple, list)) or len(value) > MAX_DIMS or \
            not all(type(n) is int and n >= 0 for n in value):
        raise InputError(f"tensor {what} {_shown(value)} is not a list of at most {MAX_DIMS} non-negative integers")
    return tuple(value)


def contiguous_strides(size: tuple[int, ...]) -> tuple[int, ...]:
    """Row-major strides (in elements) of `size`."""
    strides, step = [], 1
    for n in reversed(size):
        strides.append(step)
        step *= max(n, 1)
    return tuple(reversed(strides))


def rebuild(storage: Any, offset: Any, size: Any, stride: Any, dtype: Any = None, *, numpy: bool) -> Any:
    """A tensor (torch; with `numpy`, a read-only numpy array, bfloat16 widened to float32) viewing `storage` at
    `offset` with `size` and `stride` in elements — after checking that it reaches no byte outside the storage
    and holds no more elements than the storage does. InputError (no pointer, no repr) for anything else."""
    if not isinstance(storage, Storage):
        raise InputError(f"a tensor's storage is a {type(storage).__name__}, not a storage stored in the file")
    name = storage.dtype if dtype is None else type_name(dtype)
    size, stride = dims(size, "size"), dims(stride, "stride")
    if type(offset) is not int or offset < 0 or len(size) != len(stride):
        raise InputError(f"tensor offset {_shown(offset)}, size {size} and stride {stride} do not fit together")
    available = storage.raw.size // ITEMSIZE[name]
    count = math.prod(size)
    if count:
        last = offset + sum((n - 1) * s for n, s in zip(size, stride, strict=True))
        if last >= available:
            raise InputError(f"a {name} tensor of size {size} (strides {stride}, offset {offset}) reaches element "
                             f"{last} of a storage that holds {available}")
        if count > available:
            raise InputError(f"a {name} tensor of size {size} has {count} elements but views a storage of "
                             f"{available} (overlapping strides {stride}); save it with .contiguous()")
    return _numpy_view(storage, name, offset, size, stride) if numpy else _torch_view(storage, name, offset, size,
                                                                                      stride)


def _torch_view(storage: Storage, name: str, offset: int, size: tuple, stride: tuple) -> Any:
    import torch

    tensor = torch.empty((0,), dtype=getattr(torch, name))
    tensor.set_(storage.torch_bytes().untyped_storage(), offset, size, stride)
    return tensor


def _numpy_view(storage: Storage, name: str, offset: int, size: tuple, stride: tuple) -> np.ndarray:
    stored = np.dtype(np.uint16) if name == "bfloat16" else NUMPY_TYPES.get(name)
    if stored is None:
        raise InputError(f"a tensor has element type {name}, which rcdiag reads only with torch installed")
    raw = storage.raw
    typed = raw[: raw.size - raw.size % stored.itemsize].view(stored)
    if math.prod(size) == 0:
        view = np.zeros(size, dtype=stored)
    else:
        view = np.lib.stride_tricks.as_strided(typed[offset:], shape=size,
                                               strides=tuple(s * stored.itemsize for s in stride), writeable=False)
    if name == "bfloat16":  # the high half of a float32
        return (view.astype(np.uint32) << 16).view(np.float32)
    return view


def _shown(value: Any) -> str:
    """A value from the file as an error message may show it: numbers and short tuples of them, else its type —
    never a repr that could carry an address."""
    if type(value) in (int, float, bool) or value is None:
        return repr(value)
    if isinstance(value, (tuple, list)) and len(value) <= 8 and all(type(v) in (int, float, bool) for v in value):
        return repr(tuple(value))
    return f"(a {type(value).__name__})"
