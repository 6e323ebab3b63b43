"""Read the torch.save bytes of a TensorDict (what verl's DataProto pickles) into a dict of numpy arrays, with
neither torch nor tensordict: the bytes go through safeload's reader (stored members only, read once, within the
file's budget) and its restricted unpickler, extended by the one global a consolidated TensorDict names; every
tensor and every leaf is a view made by the one bounds-checked rebuilder (rcdiag.importers.tensors).

The format (torch.save zip, `archive/data.pkl` + `archive/data/<key>` storages): tensordict ≥ 0.5 pickles a
consolidated TensorDict (verl's `DataProto.__getstate__` consolidates it) as
`tensordict._reductions._rebuild_tensordict_files_consolidated(metadata, storage)`, where `storage` is one uint8
tensor and `metadata["leaves"]` maps each key to (dtype string, shape, start, stop, pad[, ragged index]) — bytes
[start, stop) of the storage; other metadata keys are nested TensorDicts. Plain tensors are
`torch._utils._rebuild_tensor_v2(storage, offset, size, stride, …)` over a persistent-id storage
('storage', torch.<Type>Storage, key, location, numel).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from rcdiag.errors import InputError
from rcdiag.importers.safeload import RestrictedUnpickler, load_torch_bytes
from rcdiag.importers.tensors import NUMPY_TYPES, Storage, contiguous_strides, dims, rebuild, type_name

TORCH_DTYPES: dict[str, Any] = {name: NUMPY_TYPES[name].type for name in NUMPY_TYPES}
TORCH_DTYPES["bfloat16"] = "bfloat16"
TORCH_DTYPES.update({f"torch.{k}": v for k, v in list(TORCH_DTYPES.items())})
"""torch dtype names (with or without the `torch.` prefix) → numpy dtype ("bfloat16": widened to float32)."""
_MAX_NESTING = 32


class _Unsupported(InputError):
    """An entry rcdiag does not read (located by load_tensordict_bytes)."""

    def __init__(self, message: str, field: str, hint: str) -> None:
        super().__init__(message, field=field, hint=hint)


def _leaf(key: str, leaf: Any, storage: np.ndarray) -> np.ndarray:
    """One consolidated leaf: bytes [start, stop) of `storage` viewed as (dtype, shape), bounds-checked."""
    if not isinstance(leaf, (tuple, list)) or len(leaf) < 5:
        raise InputError(f"TensorDict entry {key!r} is not (dtype, shape, start, stop, pad)", field=key)
    dtype_name, shape, start, stop = leaf[:4]
    if str(key).startswith("<NJT") or len(leaf) > 5 and leaf[5] is not None:
        raise _Unsupported(f"unsupported TensorDict entry {key!r} (a nested/ragged tensor)", key,
                           "pad the field to [batch, length] before dumping")
    try:
        name = type_name(str(dtype_name))
    except InputError:
        raise _Unsupported(f"unsupported TensorDict entry {key!r} ({str(dtype_name)[:40]})", key,
                           "pad the field to [batch, length] before dumping") from None
    if not (type(start) is int and type(stop) is int and 0 <= start <= stop <= storage.size):
        raise InputError(f"TensorDict entry {key!r} claims bytes [{start if type(start) is int else '?'}, "
                         f"{stop if type(stop) is int else '?'}) of a storage of {storage.size} bytes", field=key)
    size = dims(shape, f"shape of {key!r}")
    part = Storage(np.ascontiguousarray(storage[start:stop]), name)
    return rebuild(part, 0, size, contiguous_strides(size), numpy=True)


def _rebuild_consolidated(metadata: Any, storage: Any, depth: int = 0) -> dict[str, Any]:
    """tensordict's _rebuild_tensordict_files_consolidated, as a dict of numpy arrays (nested dicts for nested
    TensorDicts; non-tensor entries as their data)."""
    if not isinstance(metadata, dict):
        raise InputError(f"a TensorDict's metadata is a {type(metadata).__name__}, not a dict", field="batch")
    if not (isinstance(storage, np.ndarray) and storage.dtype == np.uint8 and storage.ndim == 1):
        raise InputError("a TensorDict's storage is not one flat byte tensor", field="batch")
    if depth > _MAX_NESTING:
        raise InputError(f"TensorDicts nested more than {_MAX_NESTING} deep", field="batch")
    metadata = dict(metadata)
    non_tensors = metadata.pop("non_tensors", {}) or {}
    leaves = metadata.pop("leaves", {}) or {}
    if not isinstance(non_tensors, dict) or not isinstance(leaves, dict):
        raise InputError("a TensorDict's leaves or non-tensors are not a dict", field="batch")
    out: dict[str, Any] = {str(k): v[0] if isinstance(v, tuple) else v for k, v in non_tensors.items()}
    for key, leaf in leaves.items():
        out[str(key)] = _leaf(str(key), leaf, storage)
    for name in ("cls", "cls_metadata", "size"):
        metadata.pop(name, None)
    for key, sub in metadata.items():  # what is left: nested TensorDicts
        out[str(key)] = _rebuild_consolidated(sub, storage, depth + 1)
    return out


class _TensorDictUnpickler(RestrictedUnpickler):
    """safeload's allow-list plus the consolidated TensorDict rebuilder; other tensordict classes refused."""

    def resolve(self, module: str, name: str) -> Any:
        if (module, name) == ("tensordict._reductions", "_rebuild_tensordict_files_consolidated"):
            return _rebuild_consolidated
        if module.startswith("tensordict"):
            raise _Unsupported(f"the batch is a TensorDict pickled as {module[:60]}.{name[:60]} (not consolidated), "
                               "which rcdiag does not read", "batch", "dump with tensordict ≥ 0.5 (verl consolidates "
                               "the batch then), or export the tensors as a dict with torch.save")
        return super().resolve(module, name)


def load_tensordict_bytes(blob: bytes, file: Path | str) -> Any:
    """Unpickle torch.save bytes (zip format) of a TensorDict or of plain tensors into numpy; InputError naming
    `file` (field 'batch' or the entry) when the bytes are not such an archive."""
    try:
        return load_torch_bytes(blob, str(file), numpy=True, unpickler=_TensorDictUnpickler)
    except InputError as exc:
        if exc.field is None:
            raise InputError(f"cannot read the DataProto's tensor batch: {exc.message}", file=str(file),
                             field="batch", hint="is the dump complete? verl writes it with DataProto.save_to_disk"
                             ) from None
        raise
