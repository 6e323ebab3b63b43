"""Importers for foreign rollout dumps: dispatch table from format name to reader, and the one entry point."""
from __future__ import annotations

import importlib
import os
from pathlib import Path
from typing import Any

from rcdiag.errors import ConfigError, did_you_mean
from rcdiag.importers.common import (
    Imported,
    ImportOptions,
    check_lengths,
    check_token_ids,
    mask_summary,
    nonfinite_warning,
    settle_versions,
    write_imported,
)
from rcdiag.importers.context import apply_context
from rcdiag.importers.vocab import attach_tokenizer

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
    "sglang": ("sglang", "SGLang native /generate responses with MoE routes (meta_info.routed_experts; "
                         "--tokenizer MODEL_DIR gives the routes' shape)"),
    "nemo-rl": ("nemo_rl", "NeMo-RL log dir train_data_step{N}.jsonl (both sides per token, advantages)"),
    "prime-rl": ("prime_rl", "prime-rl token_exports/step_N/rank_R.jsonl (STABLE steps; trainer side is π_θ at "
                             "the micro-step)"),
}


FLAT = ("jsonl", "parquet")
ONLY_FOR: dict[str, tuple[tuple[str, ...], str]] = {
    **{name: (FLAT, flag) for name, flag in (
        ("response_ids_field", "--response-ids-field"), ("rollout_logprobs_field", "--rollout-logprobs-field"),
        ("train_logprobs_field", "--train-logprobs-field"), ("mask_field", "--mask-field"),
        ("prompt_ids_field", "--prompt-ids-field"), ("step_field", "--step-field"), ("ids_only", "--ids-only"))},
    "train_path": (("slime", "miles"), "--train-data"),
}
"""Options that mean something for some formats only: given with another format they are refused, never ignored."""


def refuse_options(fmt: str, options: ImportOptions) -> None:
    """ConfigError for an option the format does not read (it used to be accepted and silently ignored)."""
    for attr, (formats, flag) in ONLY_FOR.items():
        if fmt not in formats and getattr(options, attr) not in (None, False):
            raise ConfigError(f"{flag} is for {'/'.join(formats)} dumps; `rcdiag import {fmt}` does not read it "
                              f"(see `rcdiag import --help`)")


def read_dump(fmt: str, path: str | os.PathLike, options: ImportOptions | None = None) -> Imported:
    """Read a dump into records without writing anything (raises InputError/ConfigError on bad input)."""
    if fmt not in FORMATS:
        raise ConfigError(f"unknown format '{fmt}' (choose from: {', '.join(FORMATS)}){did_you_mean(fmt, FORMATS)}")
    options = options or ImportOptions()
    refuse_options(fmt, options)
    module = importlib.import_module(f"rcdiag.importers.{FORMATS[fmt][0]}")
    imported = module.read(Path(path), options, fmt)
    check_token_ids(imported.records)
    check_lengths(imported.records, {"token_versions": "per-token versions", "token_advantages": "per-token "
                                     "advantages", "train_entropy": "entropy"})
    for record in imported.records:
        settle_versions(record)
    _say_measured(imported)
    if options.tokenizer and "tokenizer" not in imported.sections:
        imported.sections["tokenizer"] = attach_tokenizer(options.tokenizer, imported.records)
    apply_context(imported, options.context, options.tokenizer)
    imported.mask_counts, warnings = mask_summary(imported.records)
    imported.warnings += warnings + nonfinite_warning(imported.records)
    return imported


def _say_measured(imported: Imported) -> None:
    """The manifest's `measured` section (rcdiag.store.manifest.Measured): a dump's rollout log-probs are the ones
    its engine returned while sampling; its trainer log-probs the trainer's π_old recompute — unless the importer
    said otherwise (prime-rl: π_θ at the micro-step)."""
    measured = imported.sections.setdefault("measured", {})
    if any(r.rollout_logprobs is not None for r in imported.records):
        measured.setdefault("rollout", "sampled")
    if any(r.train_logprobs is not None for r in imported.records):
        measured.setdefault("trainer", "pi_old")


def import_run(fmt: str, path: str | os.PathLike, out: str | os.PathLike,
               options: ImportOptions | None = None) -> tuple[Any, Imported]:
    """Import the dump at `path` (format `fmt`) as a run directory at `out`; returns (Run, Imported).

    The run is written under a temporary name and renamed when complete, so a failed import leaves nothing.
    """
    options = options or ImportOptions()
    imported = read_dump(fmt, path, options)
    return write_imported(imported, out, overwrite=options.overwrite), imported


__all__ = ["FORMATS", "ImportOptions", "import_run", "read_dump"]
