"""numpy dtypes and arrays as the restricted unpickler builds them: checked against the bytes the file holds before
numpy sees them.

`numpy.dtype`'s own `__setstate__` takes any flags from the file — an `object` dtype with flags 0 made numpy read 8
file-chosen bytes as a pointer (a 269-byte slime dump crashed the interpreter) — so a dtype is made from its type
string alone and the state the file gives it must equal numpy's own state of that dtype; structured, void,
subarray and big-endian dtypes are refused. An array's shape, dtype and data are checked to agree before numpy
allocates anything, and object arrays take their elements only from the list pickled with them.
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np

from rcdiag.errors import InputError
from rcdiag.importers.tensors import MAX_DIMS

_NPY_LIST_PICKLE = 0x02  # numpy dtype flag: the array's state is a list of objects, not raw bytes
_MAX_LIST_ITEMSIZE = 64  # an object array element may cost this many bytes per pickled list item, no more
_MAX_SCRATCH_BYTES = 64  # numpy's _reconstruct makes a placeholder (shape (0,)) that BUILD then fills
_DTYPE_KINDS = frozenset("biufcUSO")
"""numpy dtype kinds a dump may hold: bool, integers, floats, complex, fixed-width text, objects."""
_SCALARS = (bool, int, float, complex, type(None), str)


def refuse_size(what: str) -> InputError:
    return InputError(f"the dump asks for {what}, an allocation sized by a number written in the file; rcdiag only "
                      "builds objects from data the file actually holds")


class PickledDtype:
    """What `numpy.dtype` resolves to while unpickling: a plain dtype made from its type string, whose pickled state
    (BUILD) must be exactly the one numpy writes for that dtype — the flags in the file never reach numpy.
    `plain_values` turns these back into numpy dtypes."""

    __slots__ = ("dtype",)

    def __init__(self, spec: Any, align: Any = False, copy: Any = True) -> None:
        self.dtype = plain_dtype(spec)
        if type(align) is not bool or type(copy) is not bool:
            raise InputError("a numpy dtype's pickled arguments are malformed")
        _MADE[0] += 1

    def __setstate__(self, state: Any) -> None:
        expected = self.dtype.__reduce__()[2]
        if not (type(state) is tuple and len(state) == len(expected) and
                all(type(a) is type(b) and a == b for a, b in zip(state, expected, strict=True))):
            raise InputError(f"a numpy {self.dtype} dtype comes with the pickled state {_short(state)} where numpy "
                             f"writes {expected}; rcdiag reads plain dtypes only as numpy pickles them")


def plain_dtype(spec: Any) -> np.dtype:
    """A dtype named by a type string from the file (or a PickledDtype), refusing structured, void, subarray,
    big-endian and non-numeric kinds."""
    if isinstance(spec, PickledDtype):
        return spec.dtype
    if isinstance(spec, bytes):
        spec = spec.decode("latin-1")
    if not isinstance(spec, str) or len(spec) > 16:
        raise InputError(f"a numpy dtype is named by a {type(spec).__name__}, not a type string")
    try:
        dtype = np.dtype(spec)
    except (TypeError, ValueError):
        raise InputError(f"a numpy dtype {spec!r} that numpy does not know") from None
    if dtype.fields is not None or dtype.subdtype is not None or dtype.kind not in _DTYPE_KINDS or \
            dtype.byteorder == ">":
        raise InputError(f"a numpy array of dtype {spec!r}: rcdiag reads numbers, text and object arrays only (no "
                         "structured, void, subarray or big-endian dtypes)")
    return dtype


def _short(value: Any) -> str:
    text = repr(value) if isinstance(value, tuple) and all(isinstance(v, _SCALARS) for v in value) else \
        f"(a {type(value).__name__})"
    return text[:120]


class CheckedArray(np.ndarray):
    """What `numpy.ndarray` resolves to while unpickling: numpy's own `__setstate__` allocates the shape written in
    the file before it looks at the data (and an object array whose list is too short crashes the interpreter), so
    the state is checked against the data first. `plain_values` turns these back into plain ndarrays."""

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        raise refuse_size("numpy.ndarray(...) called directly")

    def __setstate__(self, state: Any) -> None:
        if not isinstance(state, tuple) or len(state) not in (4, 5):
            raise InputError("a numpy array's pickled state is malformed")
        if not isinstance(state[-3], PickledDtype) or type(state[-2]) is not bool:
            raise InputError("a numpy array's pickled state has no plain dtype")
        shape, dtype, rawdata = state[-4], state[-3].dtype, state[-1]
        count = _count(shape, "numpy array shape")
        if dtype.flags & _NPY_LIST_PICKLE:
            if not isinstance(rawdata, list) or len(rawdata) != count:
                raise InputError(f"a numpy {dtype} array of shape {tuple(shape)} comes with "
                                 f"{len(rawdata) if isinstance(rawdata, list) else 'no list of'} elements")
            if dtype.itemsize > _MAX_LIST_ITEMSIZE:
                raise refuse_size(f"a numpy array of {dtype.itemsize}-byte {dtype} elements")
        elif not isinstance(rawdata, (bytes, bytearray)) or len(rawdata) != count * dtype.itemsize:
            raise InputError(f"a numpy {dtype} array of shape {tuple(shape)} needs {count * dtype.itemsize} bytes, "
                             f"the file holds {len(rawdata) if isinstance(rawdata, (bytes, bytearray)) else 'none'}")
        np.ndarray.__setstate__(self, (*state[:-3], dtype, *state[-2:]))


def _count(shape: Any, what: str) -> int:
    """The element count of a shape from the file, refusing anything but a tuple/list of non-negative ints."""
    if not isinstance(shape, (tuple, list)) or len(shape) > MAX_DIMS or \
            not all(type(n) is int and n >= 0 for n in shape):
        raise InputError(f"{what} {_short(tuple(shape) if isinstance(shape, list) else shape)} is not a list of "
                         "non-negative integers")
    return math.prod(shape)


def _numpy_attr(name: str) -> Any:
    core = np._core if hasattr(np, "_core") else np.core  # numpy 2 moved numpy.core to numpy._core
    return getattr(core.multiarray, name)


def checked_reconstruct(subtype: Any, shape: Any, dtype: Any) -> Any:
    """numpy's `_reconstruct` makes the empty placeholder array that BUILD then fills: a real shape here would be
    an allocation sized by the file."""
    if subtype is not CheckedArray:
        raise InputError(f"the dump reconstructs a numpy array of type {getattr(subtype, '__name__', '?')!r}")
    dtype = plain_dtype(dtype)
    if _count(shape, "numpy array shape") * dtype.itemsize > _MAX_SCRATCH_BYTES:
        raise refuse_size(f"a numpy placeholder array of shape {tuple(shape)} and dtype {dtype}")
    _MADE[0] += 1
    return _numpy_attr("_reconstruct")(CheckedArray, shape, dtype)


def checked_scalar(dtype: Any, *args: Any) -> Any:
    """numpy's `scalar(dtype, bytes)`: the bytes must hold the value (object scalars carry the object itself)."""
    if not isinstance(dtype, PickledDtype):
        raise InputError("a numpy scalar's pickled dtype is malformed")
    dtype = dtype.dtype
    if dtype.hasobject:
        if len(args) != 1:
            raise InputError("a numpy object scalar comes without its object")
        return args[0]
    if len(args) != 1 or not isinstance(args[0], bytes) or len(args[0]) != dtype.itemsize:
        raise InputError(f"a numpy {dtype} scalar comes without its {dtype.itemsize} bytes")
    return _numpy_attr("scalar")(dtype, *args)


NUMPY_MODULES = ("numpy.core.multiarray", "numpy._core.multiarray")
_MADE = [0]  # CheckedArrays and PickledDtypes made so far: a load that made none skips the plain_values walk


def stand_ins_made() -> int:
    """How many CheckedArrays and PickledDtypes were made so far (a load that made none need not walk its result)."""
    return _MADE[0]
