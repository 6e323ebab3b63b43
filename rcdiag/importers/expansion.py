"""How many bytes a loaded dump stands for once every reference is counted as the copy an importer makes of it,
held against the size of the file it came from.

A pickle refers to an object it already built with two bytes (BINGET), so a 1 MB file can list one sample 20,000
times; the loaded object is small (20,000 pointers), but the importer turns each reference into its own record —
20,000 copies. Counting each shared part once per path that reaches it (a walk over the object graph, each node's
size computed once) bounds what any importer can make of the file, before it makes anything.
"""
from __future__ import annotations

import collections
from typing import Any

import numpy as np

from rcdiag.errors import InputError

EXPANSION = 16
"""A dump may stand for at most this many times its own bytes (Python lists of small ints take 8 bytes an item
where the pickle spends 2–5; plus EXPANSION_FLOOR)."""
EXPANSION_FLOOR = 64 << 20
_POINTER = 8
_SCALAR_TYPES = frozenset((bool, int, float, complex, type(None)))


def _children(node: Any) -> tuple[int, list[Any]]:
    """(the node's own bytes, the nodes it refers to)."""
    kind = type(node)
    if kind in _SCALAR_TYPES:
        return _POINTER, []
    if kind in (str, bytes, bytearray):
        return _POINTER + len(node), []
    if isinstance(node, dict):
        return _POINTER * (1 + 2 * len(node)), list(node.values())
    if isinstance(node, (list, tuple, set, frozenset, collections.deque)):
        if set(map(type, node)) <= _SCALAR_TYPES:  # the common list of token ids: no walk over its items
            return _POINTER * (1 + 2 * len(node)), []
        return _POINTER * (1 + len(node)), list(node)
    if isinstance(node, np.ndarray):
        return _POINTER + node.nbytes, (list(node.reshape(-1)) if node.dtype.hasobject else [])
    if kind.__module__.startswith("torch") and hasattr(node, "element_size"):
        return _POINTER + node.nelement() * node.element_size(), []
    state = getattr(node, "__dict__", None)
    return _POINTER, (list(state.values()) if isinstance(state, dict) else [])


def expanded_size(obj: Any, limit: int) -> int:
    """The bytes `obj` stands for with every reference counted (see the module docstring); stops counting once
    past `limit` (then returns a value > limit). A reference back to a node being counted (a cycle) counts as a
    pointer."""
    sizes: dict[int, int] = {}
    keep: list[Any] = []  # nodes whose id is in `sizes` stay alive while the walk runs
    stack: list[tuple[Any, list[Any] | None, int]] = [(obj, None, 0)]
    while stack:
        node, children, own = stack.pop()
        if children is None:
            if id(node) in sizes:
                continue
            own, children = _children(node)
            sizes[id(node)] = _POINTER  # in progress: a cycle back to it counts as a pointer
            keep.append(node)
            stack.append((node, children, own))
            stack.extend((child, None, 0) for child in children if id(child) not in sizes)
            continue
        total = own + sum(sizes[id(child)] for child in children)
        sizes[id(node)] = total
        if total > limit:
            return total
    return sizes[id(obj)]


def check_expansion(obj: Any, file_bytes: int) -> None:
    """InputError when `obj`, loaded from `file_bytes` bytes, stands for more than EXPANSION × that."""
    limit = EXPANSION * file_bytes + EXPANSION_FLOOR
    size = expanded_size(obj, limit)
    if size > limit:
        raise InputError(f"the dump refers to the same data again and again: counted once per reference it stands "
                         f"for more than {limit} bytes, {EXPANSION}× its own {file_bytes} bytes (plus "
                         f"{EXPANSION_FLOOR >> 20} MiB); rcdiag reads each sample as it is stored, once",
                         hint="is it a real dump? a trainer writes every sample's own data")
