"""Progress with a silent twin: library code always reports progress and phases, the caller decides whether they
show. A bar is a tqdm bar: the notebook widget in Jupyter when ipywidgets is installed, else the plain text bar
(never tqdm.auto's "IProgress not found" warning). Phases are named, timed steps of a long command ("starting vLLM
engine", "rescoring"); their seconds feed the closing summary of `rcdiag score`, `import`, `report` and `probe`.
"""
from __future__ import annotations

import contextlib
import importlib.util
import sys
import time
from collections.abc import Iterable, Iterator
from typing import Any, TypeVar

from tqdm.std import tqdm as text_tqdm

T = TypeVar("T")


def _in_jupyter() -> bool:
    """True inside a Jupyter kernel (where a text bar's carriage returns pile up and a widget reads better)."""
    shell = getattr(sys.modules.get("IPython"), "get_ipython", lambda: None)()
    return type(shell).__name__ == "ZMQInteractiveShell"


class LogBar(text_tqdm):
    """A bar for a log file or a CI console (stderr not a terminal): no redraws, one line when it ends — the
    carriage-return redraws of a text bar left `trend: 0%|…` fragments glued to the summary lines around them."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.update(mininterval=float("inf"), maxinterval=float("inf"), delay=float("inf"))
        super().__init__(*args, **kwargs)

    def close(self) -> None:
        self.delay = 0  # close() then writes the final state once (the infinite delay kept every redraw away)
        super().close()


def bar_class() -> type[text_tqdm]:
    """tqdm's notebook widget when it can render (Jupyter with ipywidgets), the text bar on a terminal, else a bar
    that writes one line when it ends (a log file, CI)."""
    if _in_jupyter() and importlib.util.find_spec("ipywidgets") is not None:
        from tqdm.notebook import tqdm as notebook_tqdm

        return notebook_tqdm
    return text_tqdm if _is_terminal() else LogBar


def _is_terminal() -> bool:
    stream = sys.stderr
    return bool(stream is not None and stream.isatty())


def progress(iterable: Iterable[T] | None = None, *, total: float | None = None, desc: str = "",
             unit: str = "it", silent: bool = False, **kwargs: Any) -> text_tqdm:
    """A tqdm bar (update(n), set_postfix, close, context manager); `silent=True` gives the same object, hidden.

    Use `unit="tok", unit_scale=True` for token throughput (the bar then shows tokens/s). The finished bar stays
    on screen (its count and time are the record of the stage).
    """
    kwargs.setdefault("leave", True)
    return bar_class()(iterable, total=total, desc=desc, unit=unit, disable=silent, dynamic_ncols=True, **kwargs)


def iterate(iterable: Iterable[T], *, desc: str = "", silent: bool = False, **kwargs: Any) -> Iterator[T]:
    """Iterate with a progress bar."""
    yield from progress(iterable, desc=desc, silent=silent, **kwargs)


def say(line: str, silent: bool = False) -> None:
    """One line on stderr, above any running bar (nothing when silent)."""
    if not silent:
        text_tqdm.write(line, file=sys.stderr)


class Phases:
    """The named, timed phases of one command. `with phases("starting vLLM engine"):` announces the phase on
    stderr (unless silent) and adds its seconds to `seconds`, in the order the phases first ran."""

    def __init__(self, silent: bool = False) -> None:
        self.silent = silent
        self.seconds: dict[str, float] = {}

    @contextlib.contextmanager
    def __call__(self, name: str, detail: str = "") -> Iterator[None]:
        self.say(f"▸ {name}{f' ({detail})' if detail else ''}…")
        start = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - start

    def say(self, line: str) -> None:
        """One line on stderr, above any running bar (nothing when silent)."""
        say(line, self.silent)

    def timings(self) -> str:
        """`starting vLLM engine 41.2 s · generating 12.9 s · …` (empty when nothing ran)."""
        return " · ".join(f"{name} {seconds:.1f} s" for name, seconds in self.seconds.items())


def request_ticker(bar: text_tqdm) -> Any:
    """A factory for vLLM's `LLM.generate(use_tqdm=...)`: vLLM's own bars stay off and each finished request moves
    `bar` by one instead. vLLM calls the factory twice: with the requests to add (returned as they are: adding
    is quick and not what the bar counts), then with `total=` for the engine loop (a RequestTicker)."""

    def factory(iterable: Iterable[T] | None = None, **_kwargs: Any) -> Iterable[T] | RequestTicker:
        return RequestTicker(bar) if iterable is None else iterable

    return factory


class RequestTicker:
    """The few tqdm members vLLM's engine loop uses (update, n, postfix, format_dict, refresh, close), forwarding
    each finished request to the caller's bar; anything else vLLM may call is a no-op."""

    def __init__(self, bar: text_tqdm) -> None:
        self.bar = bar
        self.n = 0
        self.postfix: str | None = None
        self.start = time.perf_counter()

    @property
    def format_dict(self) -> dict[str, float]:
        return {"elapsed": max(time.perf_counter() - self.start, 1e-9)}

    def update(self, n: float = 1) -> None:
        self.n += n
        self.bar.update(n)

    def __getattr__(self, name: str) -> Any:
        return lambda *args, **kwargs: None
