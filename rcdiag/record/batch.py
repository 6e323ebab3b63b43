"""A trainer's batch as per-sample numpy arrays: padded torch tensors [B, T] or lists, on any device, in any dtype.

Trainers hold a step's batch as padded tensors on the GPU (bf16 log-probs, long ids, int masks); recording it must
not need torch imported here, and must cost one device-to-host copy per field. `per_sample` turns each accepted
form into B 1-D numpy arrays; `per_value` the per-sample scalars (one value for the batch, or B of them).
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

import numpy as np

from rcdiag.errors import InputError


@runtime_checkable
class TensorLike(Protocol):
    """What rcdiag needs of a torch tensor (duck-typed, so torch is never imported here)."""

    def detach(self) -> Any: ...

    def cpu(self) -> Any: ...


def to_numpy(value: Any) -> np.ndarray:
    """A tensor (any device; bf16 widened to float32), array or nested list as a numpy array."""
    if isinstance(value, TensorLike):
        value = value.detach().cpu()
        if str(value.dtype) in ("torch.bfloat16", "torch.float16"):
            value = value.float()
        return value.numpy()
    return np.asarray(value)


def per_sample(value: Any, n: int | None, what: str) -> list[np.ndarray] | None:
    """B one-dimensional arrays from a [B, T] tensor/array or a list of per-sample sequences (None stays None).
    `n`: the batch size the other fields gave (InputError naming `what` when it differs)."""
    if value is None:
        return None
    if isinstance(value, TensorLike | np.ndarray):
        array = to_numpy(value)
        if array.ndim != 2:
            raise InputError(f"expected a [batch, length] tensor, got shape {tuple(array.shape)}", field=what)
        rows = list(array)
    elif isinstance(value, Sequence) and not isinstance(value, str | bytes):
        rows = [to_numpy(v).reshape(-1) for v in value]
    else:
        raise InputError(f"expected a [batch, length] tensor or a list of sequences, got {type(value).__name__}",
                         field=what)
    if n is not None and len(rows) != n:
        raise InputError(f"has {len(rows)} samples, the response ids {n}", field=what)
    return rows


def per_value(value: Any, n: int, what: str) -> list[Any]:
    """B per-sample scalars: None → B Nones, a number → B copies, a [B] tensor/list → its values."""
    if value is None:
        return [None] * n
    if isinstance(value, int | float | np.integer | np.floating) and not isinstance(value, bool):
        return [value] * n
    array = to_numpy(value).reshape(-1)
    if array.size != n:
        raise InputError(f"has {array.size} values for {n} samples", field=what)
    return [None if isinstance(v, float) and np.isnan(v) else v for v in array.tolist()]
