"""Read the torch.save bytes of a TensorDict (what verl's DataProto pickles) into a dict of numpy arrays, with
neither torch nor tensordict: the zip archive is read here and its pickle goes through safeload's restricted
unpickler, extended by the three globals such a file names.

The format (torch.save zip, `archive/data.pkl` + `archive/data/<key>` storages): tensordict ≥ 0.5 pickles a
consolidated TensorDict (verl's `DataProto.__getstate__` consolidates it) as
`tensordict._reductions._rebuild_tensordict_files_consolidated(metadata, storage)`, where `storage` is one uint8
tensor and `metadata["leaves"]` maps each key to (dtype string, shape, start, stop, pad[, ragged index]); other
metadata keys are nested TensorDicts. Plain tensors are `torch._utils._rebuild_tensor_v2(storage, offset, size,
stride, …)` over a persistent-id storage ('storage', torch.<Type>Storage, key, location, numel).
"""
from __future__ import annotations

import io
import pickle
import zipfile
from pathlib import Path
from typing import Any

import numpy as np

from rcdiag.errors import InputError
from rcdiag.importers.safeload import RestrictedUnpickler

TORCH_DTYPES: dict[str, Any] = {
    **{f"torch.{k}": v for k, v in (("float32", np.float32), ("float64", np.float64), ("float16", np.float16),
                                    ("int64", np.int64), ("int32", np.int32), ("int16", np.int16),
                                    ("int8", np.int8), ("uint8", np.uint8), ("bool", np.bool_),
                                    ("bfloat16", "bfloat16"))},
}
TORCH_DTYPES.update({k.removeprefix("torch."): v for k, v in list(TORCH_DTYPES.items())})
"""torch dtype names (with or without the `torch.` prefix) → numpy dtype ("bfloat16": widened to float32)."""
_STORAGES = {"ByteStorage": np.uint8, "CharStorage": np.int8, "ShortStorage": np.int16, "IntStorage": np.int32,
             "LongStorage": np.int64, "HalfStorage": np.float16, "FloatStorage": np.float32,
             "DoubleStorage": np.float64, "BoolStorage": np.bool_, "BFloat16Storage": "bfloat16"}


class _Unsupported(Exception):
    """An entry rcdiag does not read: (message, field, hint), located by load_tensordict_bytes."""


def _view(raw: np.ndarray, dtype: Any) -> np.ndarray:
    """uint8 bytes viewed as `dtype` (bfloat16 widened to float32)."""
    if isinstance(dtype, str):  # bfloat16: the high half of a float32
        return (raw.view(np.uint16).astype(np.uint32) << 16).view(np.float32)
    return raw.view(dtype)


def _rebuild_consolidated(metadata: dict, storage: np.ndarray) -> dict[str, Any]:
    """tensordict's _rebuild_tensordict_files_consolidated, as a dict of numpy arrays (nested dicts for nested
    TensorDicts; non-tensor entries as their data)."""
    metadata = dict(metadata)
    out: dict[str, Any] = {str(k): v[0] if isinstance(v, tuple) else v
                           for k, v in dict(metadata.pop("non_tensors", {}) or {}).items()}
    for key, leaf in dict(metadata.pop("leaves", {}) or {}).items():
        dtype_name, shape, start, stop, pad = leaf[:5]
        dtype = TORCH_DTYPES.get(str(dtype_name))
        if dtype is None or str(key).startswith("<NJT"):
            raise _Unsupported(f"unsupported TensorDict entry {key!r} ({dtype_name})", str(key),
                               "pad the field to [batch, length] before dumping")
        width = 2 if isinstance(dtype, str) else np.dtype(dtype).itemsize
        raw = storage[int(start):int(stop)]
        raw = raw[: (len(raw) // width) * width]
        values = _view(raw, dtype)
        numel = int(np.prod(shape)) if len(shape) else 1
        out[str(key)] = values[:numel].reshape(tuple(int(x) for x in shape))
    for name in ("cls", "cls_metadata", "size"):
        metadata.pop(name, None)
    for key, sub in metadata.items():  # what is left: nested TensorDicts
        out[str(key)] = _rebuild_consolidated(sub, storage)
    return out


def _rebuild_tensor(storage: np.ndarray, offset: int, size: tuple, stride: tuple, *_: Any) -> np.ndarray:
    """torch._utils._rebuild_tensor_v2 over a numpy storage (a copy, C-contiguous)."""
    if not size:
        return storage[offset:offset + 1].reshape(()).copy()
    item = storage.dtype.itemsize
    return np.lib.stride_tricks.as_strided(storage[offset:], shape=tuple(size),
                                           strides=tuple(s * item for s in stride)).copy()


class _Storage:
    """A storage type named in the pickle (torch.FloatStorage …): its numpy dtype."""

    def __init__(self, dtype: Any) -> None:
        self.dtype = dtype


class _ArchiveUnpickler(RestrictedUnpickler):
    """safeload's allow-list plus the TensorDict/tensor rebuilders, storages read from the zip archive."""

    def __init__(self, handle: io.BytesIO, archive: zipfile.ZipFile, prefix: str, source: str) -> None:
        super().__init__(handle)
        self.archive, self.prefix, self.source = archive, prefix, source  # source: named by safeload's refusals

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) == ("tensordict._reductions", "_rebuild_tensordict_files_consolidated"):
            return _rebuild_consolidated
        if (module, name) == ("torch._utils", "_rebuild_tensor_v2"):
            return _rebuild_tensor
        if module in ("torch", "torch.storage") and name in _STORAGES:
            return _Storage(_STORAGES[name])
        if (module, name) == ("torch.storage", "UntypedStorage"):
            return _Storage(np.uint8)
        if module.startswith("tensordict"):
            raise _Unsupported(f"the batch is a TensorDict pickled as {module}.{name} (not consolidated), which "
                               "rcdiag does not read", "batch", "dump with tensordict ≥ 0.5 (verl consolidates the "
                               "batch then), or export the tensors as a dict with torch.save")
        return super().find_class(module, name)

    def persistent_load(self, pid: Any) -> np.ndarray:
        if not (isinstance(pid, tuple) and len(pid) >= 3 and pid[0] == "storage"):
            raise pickle.UnpicklingError(f"unsupported persistent id {pid!r}")
        kind, key = pid[1], str(pid[2])
        dtype = kind.dtype if isinstance(kind, _Storage) else np.uint8
        raw = np.frombuffer(self.archive.read(f"{self.prefix}data/{key}"), dtype=np.uint8)
        return _view(raw, dtype) if dtype is not np.uint8 else raw


def load_tensordict_bytes(blob: bytes, file: Path | str) -> Any:
    """Unpickle torch.save bytes (zip format) of a TensorDict or of plain tensors into numpy; InputError naming
    `file` when the bytes are not such an archive."""
    try:
        archive = zipfile.ZipFile(io.BytesIO(blob))
        pkl = next(n for n in archive.namelist() if n.endswith("data.pkl"))
        prefix = pkl[: -len("data.pkl")]
        return _ArchiveUnpickler(io.BytesIO(archive.read(pkl)), archive, prefix, str(file)).load()
    except _Unsupported as exc:
        message, field, hint = exc.args
        raise InputError(message, file=str(file), field=field, hint=hint) from None
    except (zipfile.BadZipFile, StopIteration, KeyError, pickle.UnpicklingError, EOFError, ValueError,
            TypeError) as exc:
        raise InputError(f"cannot read the DataProto's tensor batch ({type(exc).__name__}: {exc})", file=str(file),
                         field="batch", hint="is the dump complete? verl writes it with DataProto.save_to_disk") from None
