"""Keep glibc's allocator from handing every record batch's arrays fresh pages.

A pass allocates the same few dozen arrays of 0.1–2 MB for every 65k-row batch (decoded columns, per-row terms,
kernel outputs) and frees them a moment later. Above glibc's mmap threshold (128 KiB at start, raised only by a
large free) each of those is a fresh mmap, so every batch page-faults its memory in again and returns it: on a
10 M-token report 640k minor faults and ~15 % of the passes' time, which vanished whenever something earlier in
the process (a big np.unique) had happened to raise the threshold (issue #15). A fixed 32 MiB threshold keeps
these arrays in the heap, where the next batch reuses them; the trim threshold keeps freed heap memory for the
next batch instead of returning it at once. Peak memory is what the passes need anyway.

Linux with glibc only; elsewhere, and when the user set MALLOC_MMAP_THRESHOLD_ themselves, nothing changes.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys

MMAP_THRESHOLD = 32 << 20
TRIM_THRESHOLD = 256 << 20
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # glibc's mallopt parameter numbers (malloc.h)
_applied: bool | None = None


def reuse_batch_memory() -> bool:
    """Set the thresholds (once per process; later calls return the first answer): True when glibc took them."""
    global _applied
    if _applied is None:
        _applied = _mallopt()
    return _applied


def _mallopt() -> bool:
    if not sys.platform.startswith("linux") or "MALLOC_MMAP_THRESHOLD_" in os.environ:
        return False
    try:
        mallopt = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    return bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD))
