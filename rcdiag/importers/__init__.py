"""Importers for foreign rollout dumps: dispatch table from format name to reader, and the one entry point."""
from __future__ import annotations

import importlib
import os
from pathlib import Path
from typing import Any

from rcdiag.errors import ConfigError
from rcdiag.importers.common import (
    Imported,
    ImportOptions,
    check_token_ids,
    mask_summary,
    nonfinite_warning,
    write_imported,
)

# format name → (module under rcdiag.importers, what the format is)
FORMATS: dict[str, tuple[str, str]] = {
    "slime": ("slime", "slime torch.save dumps (--save-debug-rollout-data / --dump-details); pickle"),
    "miles": ("slime", "miles dumps (slime's format); pickle"),
    "verl": ("verl", "verl DataProto batch cache gen_batch.dp, or a dict of tensors; pickle"),
    "jsonl": ("generic", "JSON lines: one row per sequence, or OpenAI-compatible / SGLang responses"),
    "parquet": ("generic", "Parquet: one row per sequence with token ids and per-token lists"),
    "trl": ("text", "TRL completions_*.parquet (text only: retokenized with --tokenizer)"),
    "swift": ("text", "ms-swift completions.jsonl (text only: retokenized with --tokenizer)"),
    "verl-text": ("text", "verl trainer.rollout_data_dir {step}.jsonl (text only, special tokens stripped: "
                          "retokenized with --tokenizer)"),
}


def read_dump(fmt: str, path: str | os.PathLike, options: ImportOptions | None = None) -> Imported:
    """Read a dump into records without writing anything (raises InputError/ConfigError on bad input)."""
    if fmt not in FORMATS:
        raise ConfigError(f"unknown format '{fmt}' (choose from: {', '.join(FORMATS)})")
    module = importlib.import_module(f"rcdiag.importers.{FORMATS[fmt][0]}")
    imported = module.read(Path(path), options or ImportOptions(), fmt)
    check_token_ids(imported.records)
    imported.mask_counts, warnings = mask_summary(imported.records)
    imported.warnings += warnings + nonfinite_warning(imported.records)
    return imported


def import_run(fmt: str, path: str | os.PathLike, out: str | os.PathLike,
               options: ImportOptions | None = None) -> tuple[Any, Imported]:
    """Import the dump at `path` (format `fmt`) as a run directory at `out`; returns (Run, Imported).

    The run is written under a temporary name and renamed when complete, so a failed import leaves nothing.
    """
    options = options or ImportOptions()
    imported = read_dump(fmt, path, options)
    return write_imported(imported, out, overwrite=options.overwrite), imported


__all__ = ["FORMATS", "ImportOptions", "import_run", "read_dump"]
