"""Loading pickle-based dumps (torch `.pt`, pickled verl DataProto) through an allow-list, only with consent.

Pickle runs code named inside the file when it is loaded, so rcdiag refuses pickle formats unless the user passes
`--allow-pickle`. Even then `--allow-pickle` is consent to read data, never to run code, to read memory outside
what the file holds, or to let the file size rcdiag's memory:

* Nothing is ever handed to `torch.load` / `torch.jit.load`. torch.load switches to `torch.jit.load` when it sees
  a TorchScript archive (ignoring any restricted `pickle_module`), and a scripted `__setstate__` then runs. So the
  torch.save zip is opened here with `zipfile`: TorchScript archives (`code/`, `constants.pkl`) are refused, and
  `<archive>/data.pkl` is read by the restricted unpickler (`rcdiag.importers.unpickler`) whose `persistent_load`
  builds each storage from the `<archive>/data/<key>` member's own bytes, once per key. The legacy (pre-1.6,
  non-zip) format is parsed the same way, both as a whole file and as the bytes a plainly pickled tensor carries
  (`torch.storage._load_from_bytes`).
* Tensors are views checked by the one rebuilder (`rcdiag.importers.tensors`): no element outside its storage.
* Memory is bounded by the file's size: members only stored (never inflated), every byte read for members and
  storages charged to one Budget of ~2× the file (overlapping members, a storage's bytes loaded again and again),
  and the loaded object may not stand for more than EXPANSION × the file once every reference to a shared part
  is counted (20,000 references to one sample would become 20,000 copies in the importer).
"""
from __future__ import annotations

import io
import os
import re
import zipfile
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from rcdiag.errors import InputError
from rcdiag.importers.expansion import check_expansion
from rcdiag.importers.numpystate import stand_ins_made
from rcdiag.importers.tensors import ITEMSIZE, Storage, StorageType
from rcdiag.importers.unpickler import (
    Budget,
    PlainContainer,
    RestrictedUnpickler,
    plain_values,
)
from rcdiag.store.safefile import open_regular

__all__ = ["PlainContainer", "RestrictedUnpickler", "load_pickle_file", "load_torch_bytes", "require_consent"]

PICKLE_WHY = ("pickle-based files execute arbitrary code named inside them when loaded, so a dump from an "
              "untrusted source can take over this machine")
TORCHSCRIPT_WHY = ("it is a TorchScript archive (torch.jit.save: it holds code/ and constants.pkl), and rcdiag "
                   "refuses TorchScript archives: loading one runs the code inside it, even with --allow-pickle")
TORCHSCRIPT_HINT = "save the tensors themselves, e.g. torch.save(dict_of_tensors, path), or export them to Parquet"
BUDGET_FLOOR = 1 << 20
"""Bytes a load may read beyond twice the file's size (headers, the pickle of a tiny file)."""

_LEGACY_MAGIC = 0x1950A86A20F9469CFC6C  # torch.serialization.MAGIC_NUMBER, first pickle of a legacy torch.save
_LEGACY_PROTOCOL = 1001
_TORCHSCRIPT_FILES = {"constants.pkl", "bytecode.pkl", "attributes.pkl"}
_TORCHSCRIPT_DIRS = ("code/", "constants/")
_ADDRESS = re.compile(r"0x[0-9a-fA-F]{4,}")


def require_consent(path: Path, fmt: str, allow_pickle: bool) -> None:
    """Raise InputError unless the user allowed pickle loading for this format."""
    if not allow_pickle:
        raise InputError(f"the '{fmt}' format is pickle-based and {PICKLE_WHY}", file=str(path),
                         hint="if you trust this file, re-run with --allow-pickle")


def _storage_pid(pid: Any, length: int) -> tuple[StorageType, str, int]:
    """(storage type, key, element count) from torch's persistent id ('storage', type, key, location, numel[, view])."""
    if not isinstance(pid, tuple) or len(pid) != length or pid[0] != "storage":
        raise InputError(f"the dump refers to an outside object ({type(pid).__name__} of "
                         f"{len(pid) if isinstance(pid, tuple) else '?'} parts) that is not a torch storage")
    storage_type, key, numel = pid[1], pid[2], pid[4]
    if not isinstance(storage_type, StorageType) or not isinstance(key, str) or type(numel) is not int or numel < 0:
        raise InputError(f"malformed torch storage reference (type {type(storage_type).__name__}, key "
                         f"{type(key).__name__}, count {numel if type(numel) is int else type(numel).__name__})")
    return storage_type, key[:64], numel


# --- the torch.save zip format -----------------------------------------------------------------------------------

def _read_member(archive: zipfile.ZipFile, info: zipfile.ZipInfo, budget: Budget) -> np.ndarray:
    """A member's bytes as a writable uint8 array; only stored (uncompressed) members, as torch.save writes them
    (a deflated member could inflate to any size), each read charged to `budget`."""
    if info.compress_type != zipfile.ZIP_STORED:
        raise InputError(f"archive member {info.filename[:80]} is compressed; torch.save never compresses, and rcdiag "
                         "does not inflate members of a dump")
    if info.file_size != info.compress_size:
        raise InputError(f"archive member {info.filename[:80]} claims {info.file_size} bytes but stores "
                         f"{info.compress_size}")
    budget.charge(info.file_size, f"archive member {info.filename[:80]}")
    buffer = bytearray(info.file_size)
    with archive.open(info) as member:
        view, done = memoryview(buffer), 0
        while done < len(buffer):
            n = member.readinto(view[done:])
            if not n:
                raise InputError(f"archive member {info.filename[:80]} is cut short")
            done += n
    return np.frombuffer(buffer, dtype=np.uint8)


def _zip_members(archive: zipfile.ZipFile) -> dict[str, zipfile.ZipInfo]:
    """The members of a torch.save archive by name under its one top folder; TorchScript archives refused."""
    infos = archive.infolist()
    if not infos or any("/" not in info.filename for info in infos) or \
            len({info.filename.split("/", 1)[0] for info in infos}) != 1:
        raise InputError("this zip file is not a torch.save archive (its members are not in one top folder)")
    members = {info.filename.split("/", 1)[1]: info for info in infos}
    if _TORCHSCRIPT_FILES & members.keys() or any(name.startswith(_TORCHSCRIPT_DIRS) for name in members):
        raise InputError(TORCHSCRIPT_WHY, hint=TORCHSCRIPT_HINT)
    if "data.pkl" not in members:
        raise InputError("this zip file is not a torch.save archive (no data.pkl)")
    return members


def _load_zip(stream: BinaryIO, reader: _Reader) -> Any:
    """A torch.save zip: `<archive>/data.pkl` through the restricted unpickler, each storage read once from
    `<archive>/data/<key>`."""
    with zipfile.ZipFile(stream) as archive:
        members = _zip_members(archive)
        if "byteorder" in members and _read_member(archive, members["byteorder"], reader.budget).tobytes() != \
                b"little":
            raise InputError("the dump was saved on a big-endian machine, which rcdiag does not read")
        storages: dict[str, np.ndarray] = {}

        def persistent_load(pid: Any) -> Storage:
            storage_type, key, numel = _storage_pid(pid, 5)
            if key not in storages:
                info = members.get(f"data/{key}")
                if info is None:
                    raise InputError(f"storage {key!r} is missing from the archive")
                storages[key] = _read_member(archive, info, reader.budget)
            raw, nbytes = storages[key], numel * ITEMSIZE[storage_type.dtype]
            if nbytes > raw.size:
                raise InputError(f"storage {key!r} claims {numel} {storage_type.dtype} elements ({nbytes} bytes), "
                                 f"the archive holds {raw.size} bytes for it")
            return Storage(raw[:nbytes], storage_type.dtype)

        data = _read_member(archive, members["data.pkl"], reader.budget)
        return reader.unpickler(io.BytesIO(data), persistent_load).load()


# --- the legacy (pre-1.6) torch.save format, also inside plainly pickled tensors ---------------------------------

def _load_legacy(stream: BinaryIO, size: int, reader: _Reader) -> Any:
    """The rest of a legacy torch.save after its magic number: protocol, sys_info, the object pickle, the list of
    storage keys, then each storage as an int64 element count and its bytes. The object pickle comes first, so its
    storages are made empty up front — each checked to fit in the bytes that remain — and filled afterwards."""
    protocol = reader.unpickler(stream).load()
    if protocol != _LEGACY_PROTOCOL:
        raise InputError(f"unknown legacy torch.save protocol {protocol if type(protocol) is int else '?'}")
    sys_info = reader.unpickler(stream).load()
    if not isinstance(sys_info, dict) or sys_info.get("little_endian") is not True:
        raise InputError("the dump was saved on a big-endian machine, which rcdiag does not read")
    storages: dict[str, Storage] = {}
    left = [size - stream.tell()]

    def persistent_load(pid: Any) -> Storage:
        storage_type, key, numel = _storage_pid(pid, 6)
        if pid[5] is not None:
            raise InputError("the dump holds storage views of the pre-1.0 format, which rcdiag does not read")
        if key not in storages:
            nbytes = numel * ITEMSIZE[storage_type.dtype]
            if nbytes > left[0]:
                raise InputError(f"storage {key!r} claims {numel} {storage_type.dtype} elements ({nbytes} bytes), "
                                 f"the file has {left[0]} bytes left")
            left[0] -= nbytes
            reader.budget.charge(nbytes, f"storage {key!r}")
            storages[key] = Storage(np.zeros(nbytes, dtype=np.uint8), storage_type.dtype)
        return storages[key].typed(storage_type.dtype)

    obj = reader.unpickler(stream, persistent_load).load()
    keys = reader.unpickler(stream).load()
    if not isinstance(keys, list) or not all(isinstance(key, str) for key in keys) or \
            sorted(keys) != sorted(storages):
        raise InputError("the dump's list of storages does not match the storages its data refers to")
    for key in keys:
        raw = storages[key].raw
        count = int.from_bytes(stream.read(8), "little", signed=True)
        if count * ITEMSIZE[storages[key].dtype] != raw.size:
            raise InputError(f"storage {key!r} holds {count} elements, its reference said "
                             f"{raw.size // ITEMSIZE[storages[key].dtype]}")
        if raw.size and stream.readinto(memoryview(raw)) != raw.size:
            raise InputError(f"storage {key!r} is cut short")
    return obj


class _Reader:
    """One load: its source name, tensor flavour (torch or numpy), storage Budget and any extra globals."""

    def __init__(self, source: str, size: int, numpy: bool, unpickler: type[RestrictedUnpickler]) -> None:
        self.source, self.numpy, self.cls = source, numpy, unpickler
        self.budget = Budget(2 * size + BUDGET_FLOOR)

    def unpickler(self, stream: BinaryIO, persistent_load: Any = None) -> RestrictedUnpickler:
        return self.cls(stream, self.source, persistent_load=persistent_load, storage_bytes=self.storage_bytes,
                        numpy=self.numpy, budget=self.budget)

    def storage_bytes(self, data: Any) -> Storage:
        """Our `torch.storage._load_from_bytes`: a plainly pickled tensor carries its storage as a legacy
        torch.save (or, if crafted, any torch.save) of the storage alone — parsed here, never by torch.load."""
        if not isinstance(data, (bytes, bytearray)):
            raise InputError(f"a pickled storage is a {type(data).__name__}, not bytes")
        self.budget.charge(len(data), "a pickled storage")
        stream = io.BytesIO(data)
        if data[:2] == b"PK":
            result = _load_zip(stream, self)
        elif self.unpickler(stream).load() == _LEGACY_MAGIC:
            result = _load_legacy(stream, len(data), self)
        else:
            raise InputError("a pickled storage is not a torch.save of a storage")
        if not isinstance(result, Storage):
            raise InputError(f"a pickled storage holds a {type(result).__name__}, not a storage")
        return result

    def load(self, handle: BinaryIO, size: int) -> Any:
        """Whatever the stream holds: a torch.save zip, a legacy torch.save or a plain pickle."""
        made = stand_ins_made()
        start = handle.read(2)
        handle.seek(0)
        if start == b"PK":
            result = _load_zip(handle, self)
        else:
            result = self.unpickler(handle).load()
            if type(result) is int and result == _LEGACY_MAGIC and handle.tell() < size:
                result = _load_legacy(handle, size, self)
        result = plain_values(result) if stand_ins_made() != made else result
        check_expansion(result, size)
        return result


def load_torch_bytes(data: bytes, source: str, *, numpy: bool = True,
                     unpickler: type[RestrictedUnpickler] = RestrictedUnpickler) -> Any:
    """torch.save bytes (e.g. the TensorDict inside verl's DataProto) loaded like a file, tensors as numpy arrays
    unless `numpy=False`; `unpickler` may extend the allow-list (a subclass). InputError naming `source`."""
    return _located(source, lambda: _Reader(source, len(data), numpy, unpickler).load(io.BytesIO(data), len(data)))


def load_pickle_file(path: Path) -> Any:
    """Load a torch.save file (zip or legacy) or a plain pickle through the restricted unpickler, without torch.load
    ever seeing it; InputError naming the file for anything it cannot or will not read."""
    source = str(path)

    def load() -> Any:
        with open_regular(path, "dump") as handle:  # a FIFO used to block here before any check
            size = os.fstat(handle.fileno()).st_size
            return _Reader(source, size, False, RestrictedUnpickler).load(handle, size)

    return _located(source, load)


def _located(source: str, load: Any) -> Any:
    """`load()`, with every failure an InputError naming `source` (never a traceback, never an address)."""
    try:
        return load()
    except InputError as exc:
        if exc.file is None:
            raise exc.located(source) from None
        raise
    except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
        raise InputError("no such file", file=source) from None
    except MemoryError:
        raise InputError("the dump asks for more memory than this machine has", file=source,
                         hint="is it a real dump? rcdiag reads tensors, lists and dicts, nothing larger than the file"
                         ) from None
    except RecursionError:
        raise InputError("the dump nests deeper than rcdiag reads", file=source) from None
    except Exception as exc:  # noqa: BLE001 — anything a malformed or hostile file makes the parsers raise
        text = _ADDRESS.sub("0x…", str(exc)[:300])
        raise InputError(f"cannot read the dump ({type(exc).__name__}: {text})", file=source,
                         hint="is it complete? a dump cut short by a crash cannot be loaded") from None
