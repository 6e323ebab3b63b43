"""What the trainer hooks (rcdiag.record.trl, rcdiag.record.verl) share. A recorder must never break training: what
they run inside a training step goes through `HookGuard`, which turns any failure into one warning and a skipped
record; `merge_sections` lays a user's manifest sections over what the trainer's config said.

Why not let it raise: the hook runs inside the trainer's step, on the trainer's objects; a shape rcdiag did not
expect, a None in a field verl fills for outputs without a version, a full disk — each would kill a run that had
hours of GPU time in it, for the sake of a diagnostic. The guard warns once per kind of failure (the first step it
happened at, the error, that training goes on), counts every later one silently (`failures`, `skipped`), and
lets only what must stop the process through (KeyboardInterrupt, SystemExit: BaseException, not Exception).
"""
from __future__ import annotations

import warnings
import weakref
from collections.abc import Callable
from typing import Any


class RecorderWarning(UserWarning):
    """A trainer hook skipped a record, or records less than it could (rollout-only shards)."""


class HookGuard:
    """Runs a hook's recording calls (`run`) and its one-time notices (`say_once`) without ever raising."""

    def __init__(self, hook: str) -> None:
        self.hook = hook
        self.failures = 0
        self.skipped: list[int] = []
        """The steps whose record failed (and were skipped)."""
        self._said: set[str] = set()

    def run(self, step: int, record: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """`record(*args, **kwargs)`; on an exception: one warning for its kind, the step skipped, None returned."""
        try:
            return record(*args, **kwargs)
        except Exception as exc:  # noqa: BLE001 — the point: nothing a record does may reach the training step
            self.failures += 1
            self.skipped.append(int(step))
            self.say_once(type(exc).__name__, f"step {step} was not recorded ({type(exc).__name__}: {exc}); training "
                          "goes on, and later failures of this kind skip their step silently "
                          f"({self.hook}: HookGuard.skipped lists them)")
            return None

    def done(self, key: str) -> bool:
        """Whether `key` was seen before (and mark it seen): for what a hook does once per run."""
        seen = key in self._said
        self._said.add(key)
        return seen

    def say_once(self, key: str, message: str) -> None:
        """Warn `message` (prefixed with the hook's name) the first time `key` comes up; never raises."""
        if key in self._said:
            return
        self._said.add(key)
        try:
            warnings.warn(f"rcdiag {self.hook}: {message}", RecorderWarning, stacklevel=3)
        except Exception:  # noqa: BLE001 — warnings turned into errors (-W error) must not stop training either
            pass


_GUARDS: weakref.WeakKeyDictionary[Any, HookGuard] = weakref.WeakKeyDictionary()


def guard_of(owner: Any, hook: str) -> HookGuard:
    """The one HookGuard of `owner` (a Recorder) for `hook`: a failure kind is said once per run, not per step."""
    guard = _GUARDS.get(owner)
    if guard is None:
        guard = _GUARDS[owner] = HookGuard(hook)
    return guard


def merge_sections(base: dict[str, Any], given: dict[str, Any]) -> dict[str, Any]:
    """`given` over `base`, one level deep for dict sections (a user's {"engine": {"temperature": …}} keeps the rest
    of what the trainer's config said)."""
    out = dict(base)
    for key, value in given.items():
        out[key] = {**out[key], **value} if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out
