"""Typed errors users can cause; the CLI turns each into `Error: …` and exit code 1."""
from __future__ import annotations

import difflib
from collections.abc import Callable, Collection, Iterable


class RcdiagError(Exception):
    """Base class of every error rcdiag raises on purpose (never for a bug)."""


class InputError(RcdiagError, ValueError):
    """Bad input data, located as precisely as known: file, row, field, and a hint at the fix."""

    def __init__(self, message: str, *, file: str | None = None, row: int | None = None,
                 field: str | None = None, hint: str | None = None) -> None:
        self.message, self.file, self.row, self.field, self.hint = message, file, row, field, hint
        where = []
        if file is not None:
            where.append(str(file))
        if row is not None:
            where.append(f"row {row}")
        if field is not None:
            where.append(f"field '{field}'")
        text = (" ".join(where) + ": " if where else "") + message
        if hint:
            text += f" — {hint}"
        super().__init__(text)

    def located(self, file: str) -> InputError:
        """The same error, naming `file` (for a reader that learns the file's name only above the parser)."""
        return InputError(self.message, file=file, row=self.row, field=self.field, hint=self.hint)


class RunDirError(RcdiagError):
    """A path that is not a (complete) run directory, or a run that conflicts with the requested one."""


class ConfigError(RcdiagError, ValueError):
    """An invalid option or option combination (unknown mode, bad threshold, unsafe sampling settings…)."""


def did_you_mean(word: str, choices: Iterable[str], *, n: int = 2, show: Callable[[str], str] = repr,
                 prefer: Collection[str] = ()) -> str:
    """' (did you mean 'kl'?)' naming the close matches of a mistyped `word` among `choices` (difflib, the closest
    first; those in `prefer` before the others), or '' when nothing is close: the one wording of every error that
    guesses what was meant (a --fail-if name, a --fail-on level, a run directory)."""
    close = difflib.get_close_matches(word, list(choices), n=2 * n if prefer else n, cutoff=0.6)
    close = sorted(close, key=lambda c: c not in prefer)[:n]  # stable: by closeness within each group
    return f" (did you mean {' or '.join(show(c) for c in close)}?)" if close else ""
