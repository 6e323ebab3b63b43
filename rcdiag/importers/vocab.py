"""The `--tokenizer` of an import: loaded once, held against the imported ids, attached to the run's manifest.

Every importer honours it: text dumps need it to turn text into ids; token-id dumps (JSONL/Parquet, slime, verl,
NeMo-RL, prime-rl) get it recorded as the manifest's `tokenizer` section, which the report (worst tokens in
context), the notebook and the dashboard's token strips decode with (rcdiag.tokenizers.manifest_tokenizer_dir). An
id the tokenizer does not have means the tokenizer is not the policy's: refused, naming the row.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from rcdiag.errors import ConfigError, InputError
from rcdiag.importers.common import Record
from rcdiag.store.manifest import abs_path
from rcdiag.tokenizers import TOKENIZER_FILES, has_tokenizer, load_tokenizer


def tokenizer_section(path: str, tokenizer: Any) -> dict[str, Any]:
    """The manifest's tokenizer section for a loaded tokenizer (transformers or `tokenizers`): its absolute path
    and size with added tokens (len(AutoTokenizer): the count `rcdiag score`'s vocabulary check compares)."""
    from tokenizers import Tokenizer

    size = tokenizer.get_vocab_size(with_added_tokens=True) if isinstance(tokenizer, Tokenizer) else len(tokenizer)
    return {"path": abs_path(path), "vocab_size": int(size)}


def _light_tokenizer(path: str) -> Any:
    """The directory's tokenizer.json through the `tokenizers` package (0.1 s), else transformers (seconds):
    a token-id import only records the tokenizer and checks the ids' range."""
    from rcdiag.tokenizers import fast_tokenizer

    return fast_tokenizer({"tokenizer": {"path": path}}) or load_tokenizer(path, what="--tokenizer")


def check_vocabulary(records: Sequence[Record], vocab_size: int, path: str) -> None:
    """Every response and prompt id must be below the tokenizer's size."""
    for record in records:
        for what, ids in (("response", record.response_ids), ("prompt", record.prompt_ids)):
            if ids is None or not len(ids):
                continue
            ids = np.asarray(ids)
            if int(ids.max()) >= vocab_size:
                at = int(np.flatnonzero(ids >= vocab_size)[0])
                raise InputError(f"{what} token id {int(ids[at])} (position {at}) is outside the vocabulary of "
                                 f"--tokenizer {path} ({vocab_size} ids)", file=record.where[0],
                                 row=record.where[1], field="token ids",
                                 hint="pass the tokenizer of the policy that generated the dump")


def attach_tokenizer(path: str, records: Sequence[Record], tokenizer: Any = None) -> dict[str, Any]:
    """Load `path` (unless given loaded), check the records' ids against it, and return its manifest section."""
    if not has_tokenizer(path):
        raise ConfigError(f"--tokenizer {path}: not a local directory holding tokenizer files "
                          f"({', '.join(TOKENIZER_FILES)})")
    tokenizer = tokenizer if tokenizer is not None else _light_tokenizer(path)
    section = tokenizer_section(path, tokenizer)
    check_vocabulary(records, section["vocab_size"], path)
    return section
