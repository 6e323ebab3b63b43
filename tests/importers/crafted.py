"""Hand-made hostile dumps for the adversarial importer tests: pickles whose every opcode is chosen here (a tensor's
offset, size and stride, a dtype's pickled flags, references to one object), torch.save zips built byte by byte
(stored or deflated members, members whose bytes overlap), and verl's DataProto around any inner batch bytes.
Nothing here is a checked-in blob: each file is written by the test that reads it."""
from __future__ import annotations

import io
import pickle
import struct
import sys
import types
import zipfile
import zlib
from collections import OrderedDict
from typing import Any

import numpy as np
import torch


class Reduce:
    """Pickles as `func(*args)` (plus an optional BUILD state), whatever func is."""

    def __init__(self, func: Any, args: tuple, state: Any = None) -> None:
        self.func, self.args, self.state = func, args, state

    def __reduce__(self):
        return (self.func, self.args) if self.state is None else (self.func, self.args, self.state)


class Pid:
    """A persistent id (torch's storage reference) where the pickle should write one."""

    def __init__(self, pid: tuple) -> None:
        self.pid = pid


def storage(key: str, numel: int, kind: Any = torch.FloatStorage) -> Pid:
    return Pid(("storage", kind, key, "cpu", numel))


def tensor(pid: Pid, offset: int, size: tuple, stride: tuple) -> Reduce:
    """`torch._utils._rebuild_tensor_v2(storage, offset, size, stride, …)` with every value as given."""
    return Reduce(torch._utils._rebuild_tensor_v2, (pid, offset, size, stride, False, OrderedDict()))


def pickle_bytes(obj: Any, protocol: int = 2) -> bytes:
    class Pickler(pickle.Pickler):
        def persistent_id(self, o):
            return o.pid if isinstance(o, Pid) else None

    buffer = io.BytesIO()
    Pickler(buffer, protocol=protocol).dump(obj)
    return buffer.getvalue()


def torch_zip(obj: Any, storages: dict[str, bytes], *, deflate: tuple[str, ...] = ()) -> bytes:
    """A torch.save-shaped zip (archive/data.pkl, byteorder, data/<key>, version) holding `obj`; the storages named
    in `deflate` are written compressed."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_STORED) as zf:
        zf.writestr("archive/data.pkl", pickle_bytes(obj))
        zf.writestr("archive/byteorder", "little")
        for key, data in storages.items():
            method = zipfile.ZIP_DEFLATED if key in deflate else zipfile.ZIP_STORED
            zf.writestr(zipfile.ZipInfo(f"archive/data/{key}"), data, compress_type=method)
        zf.writestr("archive/version", "3\n")
    return buffer.getvalue()


def _local_header(name: bytes, crc: int, size: int) -> bytes:
    return struct.pack("<IHHHHHIIIHH", 0x04034B50, 20, 0, 0, 0, 0x21, crc, size, size, len(name), 0) + name


def _central_entry(name: bytes, crc: int, size: int, offset: int) -> bytes:
    return struct.pack("<IHHHHHHIIIHHHHHII", 0x02014B50, 20, 20, 0, 0, 0, 0x21, crc, size, size, len(name), 0, 0,
                       0, 0, 0, offset) + name


def overlapping_zip(head: dict[str, bytes], n: int, payload: bytes) -> bytes:
    """A stored zip: the `head` members, then `n` members archive/data/0000… whose local headers follow each other
    and whose data each runs to the end of `payload` — member i's bytes hold every later header and the payload,
    so reading all n reads ~n × len(payload) from one copy (built back to front: each CRC covers the headers after
    it)."""
    out, central = bytearray(), bytearray()
    for name, data in head.items():
        raw = f"archive/{name}".encode()
        central += _central_entry(raw, zlib.crc32(data), len(data), len(out))
        out += _local_header(raw, zlib.crc32(data), len(data)) + data
    tail = payload
    headers = []
    for i in reversed(range(n)):
        raw = f"archive/data/{i:04d}".encode()
        headers.append((raw, zlib.crc32(tail), len(tail)))
        tail = _local_header(raw, zlib.crc32(tail), len(tail)) + tail
    base = len(out)
    offset = base
    for raw, crc, size in reversed(headers):
        central += _central_entry(raw, crc, size, offset)
        offset += len(_local_header(raw, crc, size))
    out += tail
    eocd = struct.pack("<IHHHHIIH", 0x06054B50, 0, 0, len(head) + n, len(head) + n, len(central), len(out), 0)
    return bytes(out + central + eocd)


def dataproto(state: tuple) -> bytes:
    """A pickle of `verl.protocol.DataProto` whose state is `state` (batch bytes, non_tensor_batch, meta_info), as
    DataProto.save_to_disk writes it — made with a stand-in module, so verl need not be installed."""
    package, module = types.ModuleType("verl"), types.ModuleType("verl.protocol")

    class DataProto:
        def __reduce__(self):
            return (DataProto, (), state)

    DataProto.__module__, DataProto.__qualname__ = "verl.protocol", "DataProto"
    module.DataProto = DataProto
    saved = {name: sys.modules.get(name) for name in ("verl", "verl.protocol")}
    sys.modules.update({"verl": package, "verl.protocol": module})
    try:
        return pickle.dumps(DataProto(), protocol=4)
    finally:
        for name, value in saved.items():
            if value is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = value


def verl_batch(b: int = 2, resp: int = 4, prompt: int = 2) -> tuple[dict[str, Any], dict[str, bytes]]:
    """A plain-tensor batch of honest storages (responses, attention_mask, response_mask, rollout_log_probs):
    the (object, storages) pair for torch_zip; a test then swaps in one crafted tensor."""
    rng = np.random.default_rng(0)
    arrays = {"responses": rng.integers(1, 100, (b, resp)).astype(np.int64),
              "attention_mask": np.ones((b, prompt + resp), np.int64),
              "response_mask": np.ones((b, resp), np.int64),
              "rollout_log_probs": -rng.random((b, resp)).astype(np.float32)}
    kinds = {np.dtype(np.int64): torch.LongStorage, np.dtype(np.float32): torch.FloatStorage}
    obj, storages = {}, {}
    for i, (name, array) in enumerate(arrays.items()):
        storages[str(i)] = array.tobytes()
        pid = storage(str(i), array.size, kinds[array.dtype])
        obj[name] = tensor(pid, 0, array.shape, tuple(s // array.itemsize for s in array.strides))
    return obj, storages


def uids(b: int) -> dict[str, np.ndarray]:
    return {"uid": np.array([f"u{i}" for i in range(b)], dtype=object)}
