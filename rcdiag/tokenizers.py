"""The one tokenizer-loading policy: local directories only (no hub), remote code only when asked, and a clear
error — or None where decoding is a courtesy — when a directory has no loadable tokenizer.

Every part that needs a tokenizer comes here: `score` (chat templates and the vocabulary check), the text
importers (re-tokenizing dumps), the report and the notebook (decoding the worst tokens), the dashboard (token
strips, through the light `tokenizers` package rather than transformers).
"""
from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import Any

from rcdiag.errors import ConfigError

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json")
"""A directory holding one of these has a tokenizer to load."""
READ_FILES = (*TOKENIZER_FILES, "merges.txt", "vocab.txt", "tokenizer.model", "spiece.model", "sentencepiece.bpe.model",
              "special_tokens_map.json", "added_tokens.json", "chat_template.jinja", "chat_template.json", "config.json")
"""Files a tokenizer load reads whole (transformers and `tokenizers`), each checked before it is loaded."""
MAX_TOKENIZER_BYTES = 128 << 20
"""Largest tokenizer file loaded: the largest real ones are ~35 MB (Gemma 3's tokenizer.json 33 MB, Llama 3's
9 MB); a 595 MB tokenizer.json took 27 s and 1.6 GB to load (or to refuse) only to decode ten tokens."""


def tokenizer_problem(path: str | os.PathLike) -> str | None:
    """Why the tokenizer files of directory `path` must not be loaded — one that is not a regular file (a FIFO
    blocks the `tokenizers` reader forever, /dev/zero never ends) or is larger than MAX_TOKENIZER_BYTES — or None."""
    import stat

    directory = Path(path).expanduser()
    for name in READ_FILES:
        file = directory / name
        try:
            info = file.stat()
        except OSError:
            if os.path.lexists(file):
                return f"{file} cannot be read (a dangling link?)"
            continue
        if not stat.S_ISREG(info.st_mode):
            return f"{file} is not a regular file (a directory, FIFO or device)"
        if info.st_size > MAX_TOKENIZER_BYTES:
            return (f"{file} is {info.st_size:,} bytes, more than the {MAX_TOKENIZER_BYTES >> 20} MiB rcdiag loads "
                    "as a tokenizer file (real ones are at most ~35 MB)")
    return None


def has_tokenizer(path: str | os.PathLike) -> bool:
    """True when `path` is a local directory holding tokenizer files."""
    directory = Path(path).expanduser()
    try:
        return any((directory / name).is_file() for name in TOKENIZER_FILES)
    except OSError:
        return False


def load_tokenizer(path: str | os.PathLike | None, *, trust_remote_code: bool = False, what: str = "--tokenizer"
                   ) -> Any:
    """A transformers AutoTokenizer from a local directory, offline. ConfigError (naming `what`, the option or
    setting the path came from) when the path is missing or the tokenizer does not load."""
    if not path:
        raise ConfigError(f"{what}: give the policy model's local tokenizer directory")
    problem = tokenizer_problem(path)
    if problem is not None:
        raise ConfigError(f"{what} {path}: {problem} — point it at the policy model's tokenizer directory")
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(str(path), local_files_only=True, trust_remote_code=trust_remote_code)
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{what} {path}: cannot load a tokenizer offline ({exc})") from None


def try_load_tokenizer(path: str | os.PathLike | None, *, warn: str | None = None) -> Any | None:
    """The AutoTokenizer of a local directory, or None when it has no tokenizer files or they do not load.
    `warn`: what is skipped without it (a warning says so when files exist but do not load)."""
    if not path or not has_tokenizer(path):
        return None
    try:
        return load_tokenizer(path, what="tokenizer")
    except ConfigError as exc:
        if warn:
            warnings.warn(f"{exc}; {warn}", stacklevel=3)
        return None


def manifest_tokenizer_dir(manifest: dict[str, Any]) -> str | None:
    """The local tokenizer directory a run's manifest names (tokenizer.path, else the engine model's path), when
    it holds tokenizer files; else None."""
    tokenizer = manifest.get("tokenizer") if isinstance(manifest.get("tokenizer"), dict) else {}
    models = manifest.get("models") if isinstance(manifest.get("models"), dict) else {}
    engine = models.get("engine") if isinstance(models.get("engine"), dict) else {}
    for path in (tokenizer.get("path"), engine.get("path")):
        if isinstance(path, str) and path and len(path) < 4096 and has_tokenizer(path):
            return path
    return None


def run_tokenizer(manifest: dict[str, Any]) -> Any | None:
    """The run's own tokenizer (transformers) when its manifest names a local directory that loads, else None:
    decoding tokens in reports and notebooks is a courtesy, never a reason to fail."""
    return try_load_tokenizer(manifest_tokenizer_dir(manifest))


def fast_tokenizer(manifest: dict[str, Any]) -> Any | None:
    """The run's `tokenizers.Tokenizer` (tokenizer.json, no transformers import) for light decoding, or None."""
    directory = manifest_tokenizer_dir(manifest)
    file = Path(directory) / "tokenizer.json" if directory else None
    if file is None or not file.is_file() or tokenizer_problem(directory) is not None:
        return None
    try:
        from tokenizers import Tokenizer

        return Tokenizer.from_file(str(file))
    except Exception:  # noqa: BLE001 - a broken or foreign tokenizer file: callers show ids instead
        return None
