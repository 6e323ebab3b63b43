"""The record framing of tracker logs, every record's checksum verified: TensorBoard's TFRecord event files and W&B's
LevelDB-style `.wandb` log. A reader that stops at the first damaged record, or never checks, lets a cross-check
compare what happened to come before the damage and call it agreement (or blame the trainer for a damaged file);
here damage is found, located (file, record, byte) and refused as data loss.

TFRecord: per record a little-endian uint64 length, the masked crc32c of those 8 bytes, the data, the masked crc32c
of the data (TensorBoard's `tensorboard/summary/writer/record_writer.py`). W&B: a 7-byte file header (`:W&B`,
a 2-byte magic, a version byte), then 32 KiB blocks of records with a 7-byte header — uint32 checksum, uint16
length, uint8 type (FULL/FIRST/MIDDLE/LAST) — whose checksum is zlib's CRC-32 of the type byte then the data
(what wandb-core writes; checked against real offline runs in the tests).
"""
from __future__ import annotations

import struct
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path

from rcdiag.errors import InputError

MAX_LOG_BYTES = 4 << 30
"""Largest tracker log read (each file is read whole): a bound, so a device or a runaway file fails plainly."""
WANDB_BLOCK = 32768
WANDB_HEADER = 7
WANDB_MAGIC = b":W&B"
_FULL, _FIRST, _MIDDLE, _LAST = 1, 2, 3, 4
_MASK_DELTA = 0xA282EAD8


def _crc32c_function() -> Callable[[bytes], int]:
    """crc32c from the `crc32c` package (C, hardware), else TensorBoard's pure-Python one (slow: ~1 MB/s)."""
    try:
        from crc32c import crc32c

        return crc32c
    except ImportError:
        from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import crc32c

        return crc32c


def masked_crc32c(data: bytes, crc32c: Callable[[bytes], int]) -> int:
    crc = crc32c(data)
    return (((crc >> 15) | (crc << 17)) + _MASK_DELTA) & 0xFFFFFFFF


def read_log(file: Path, what: str) -> bytes:
    """A tracker log's bytes: a regular file (no FIFO, device or directory) of at most MAX_LOG_BYTES."""
    try:
        info = file.stat()
    except OSError as exc:
        raise InputError(f"cannot read the {what} ({exc.strerror})", file=str(file)) from None
    import stat

    if not stat.S_ISREG(info.st_mode):
        raise InputError(f"is not a regular file; a {what} is a file", file=str(file))
    if info.st_size > MAX_LOG_BYTES:
        raise InputError(f"is {info.st_size} bytes, more than the {MAX_LOG_BYTES >> 30} GiB rcdiag reads as a {what}",
                         file=str(file))
    return file.read_bytes()


def check_event_file(file: Path) -> int:
    """Verify every TFRecord of a TensorBoard event file; the number of records. InputError naming the record and
    byte at the first damaged or incomplete one (the data after it is lost to every reader)."""
    data = read_log(file, "TensorBoard event file")
    crc32c = _crc32c_function()
    offset = count = 0
    while offset < len(data):
        if offset + 12 > len(data):
            raise _lost(file, count, offset, "the file ends inside a record header (cut short)")
        header = data[offset:offset + 8]
        (length,) = struct.unpack("<Q", header)
        (header_crc,) = struct.unpack("<I", data[offset + 8:offset + 12])
        if masked_crc32c(header, crc32c) != header_crc:
            raise _lost(file, count, offset, "the record's length fails its crc32c")
        end = offset + 12 + length
        if end + 4 > len(data):
            raise _lost(file, count, offset, f"the record claims {length} bytes but the file ends first (cut short)")
        (data_crc,) = struct.unpack("<I", data[end:end + 4])
        if masked_crc32c(data[offset + 12:end], crc32c) != data_crc:
            raise _lost(file, count, offset, "the record's data fails its crc32c")
        offset, count = end + 4, count + 1
    return count


def _lost(file: Path, record: int, offset: int, why: str) -> InputError:
    return InputError(f"damaged at record {record + 1} (byte {offset}): {why}. Every value after it is lost, so the "
                      "cross-check stops instead of comparing what came before — this is damage to the file, not a "
                      "disagreement of the trainer's numbers", file=str(file),
                      hint="copy the log again from where the trainer wrote it, or cross-check another copy")


def wandb_records(file: Path) -> Iterator[bytes]:
    """The record payloads of a `.wandb` log (fragments joined), every record's checksum verified; InputError at
    the first damaged, unknown or incomplete record (a run still being written ends in one: re-read it later)."""
    data = read_log(file, "W&B run log")
    if data[:4] != WANDB_MAGIC:
        raise InputError("not a W&B run log (no :W&B header)", file=str(file))
    offset, pending, count = WANDB_HEADER, None, 0
    while offset < len(data):
        left = WANDB_BLOCK - offset % WANDB_BLOCK
        if left < WANDB_HEADER:
            offset += left
            continue
        if offset + WANDB_HEADER > len(data):
            raise _wandb_lost(file, count, offset, "the log ends inside a record header (cut short)")
        crc, length, kind = struct.unpack("<IHB", data[offset:offset + WANDB_HEADER])
        if kind == 0 and length == 0 and crc == 0:  # zero padding (as wandb leaves it), no record
            offset += WANDB_HEADER
            continue
        body = data[offset + WANDB_HEADER:offset + WANDB_HEADER + length]
        if len(body) < length:
            raise _wandb_lost(file, count, offset, f"the record claims {length} bytes but the log ends first (cut "
                              "short; a run still being written ends so — read it again once it has finished)")
        if zlib.crc32(body, zlib.crc32(bytes([kind]))) != crc:
            raise _wandb_lost(file, count, offset, "the record fails its CRC-32")
        offset += WANDB_HEADER + length
        count += 1
        if kind == _FULL and pending is None:
            yield body
        elif kind == _FIRST and pending is None:
            pending = body
        elif kind == _MIDDLE and pending is not None:
            pending += body
        elif kind == _LAST and pending is not None:
            yield pending + body
            pending = None
        else:
            raise _wandb_lost(file, count - 1, offset, f"record type {kind} out of order")
    if pending is not None:
        raise _wandb_lost(file, count, offset, "the log ends inside a fragmented record (cut short)")


def _wandb_lost(file: Path, record: int, offset: int, why: str) -> InputError:
    return InputError(f"damaged W&B log at record {record + 1} (byte {offset}): {why}. The values after it are lost; "
                      "this is damage to the file, not a disagreement of the trainer's numbers", file=str(file),
                      hint="copy the run directory again, or cross-check another copy")
