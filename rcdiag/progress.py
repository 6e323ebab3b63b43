"""Progress bars with a silent twin: library code always reports progress, the CLI decides whether it shows."""
from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any, TypeVar

from tqdm.auto import tqdm

T = TypeVar("T")


def progress(iterable: Iterable[T] | None = None, *, total: float | None = None, desc: str = "",
             unit: str = "it", silent: bool = False, **kwargs: Any) -> tqdm:
    """A tqdm bar (update(n), set_postfix, close, context manager); `silent=True` gives the same object, hidden.

    Use `unit="tok", unit_scale=True` for token throughput (the bar then shows tokens/s).
    """
    return tqdm(iterable, total=total, desc=desc, unit=unit, disable=silent, dynamic_ncols=True, leave=False,
                **kwargs)


def iterate(iterable: Iterable[T], *, desc: str = "", silent: bool = False, **kwargs: Any) -> Iterator[T]:
    """Iterate with a progress bar."""
    yield from progress(iterable, desc=desc, silent=silent, **kwargs)
