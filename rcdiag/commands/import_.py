"""`rcdiag import`: turn a framework's rollout dump into a run directory (thin shell over rcdiag.importers)."""
from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated

import typer

from rcdiag.errors import ConfigError
from rcdiag.importers import FORMATS, ImportOptions, import_run
from rcdiag.importers.common import Imported, summary_lines
from rcdiag.importers.context import ImportContext

_D = ImportOptions()
_FIELD = "jsonl/parquet: name of the field holding"
_CTX = "Context (what the dump cannot say)"
FORMAT_HELP = "One of: " + "; ".join(f"{name} ({what})" for name, (_, what) in FORMATS.items()) + "."
"""Each format with its one-line description, from the importers' table (rcdiag.importers.FORMATS)."""


def command(
    fmt: Annotated[str, typer.Argument(metavar="FORMAT", help=FORMAT_HELP)],
    path: Annotated[Path, typer.Argument(help="The dump: a file or a directory (see FORMAT).")],
    out: Annotated[Path, typer.Option("--out", "-o", help="Run directory to create.")],
    allow_pickle: Annotated[bool, typer.Option(
        "--allow-pickle", help="Load pickle-based dumps (slime/miles .pt, verl .dp). Pickle runs code named in "
                               "the file when loaded: use only for dumps you trust.")] = _D.allow_pickle,
    tokenizer: Annotated[str | None, typer.Option(
        help="The policy's local tokenizer directory: required for trl/swift/verl-text (retokenizing); for every "
             "other format recorded in the manifest, so reports and the dashboard show token text.")] = _D.tokenizer,
    train_data: Annotated[str | None, typer.Option(
        help="slime/miles: the train dump (with log_probs) for a single rollout dump file.")] = _D.train_path,
    response_ids_field: Annotated[str | None, typer.Option(help=f"{_FIELD} response token ids.")] = None,
    rollout_logprobs_field: Annotated[str | None, typer.Option(help=f"{_FIELD} rollout logprobs.")] = None,
    train_logprobs_field: Annotated[str | None, typer.Option(help=f"{_FIELD} trainer logprobs.")] = None,
    mask_field: Annotated[str | None, typer.Option(help=f"{_FIELD} the loss mask (0 = excluded).")] = None,
    prompt_ids_field: Annotated[str | None, typer.Option(help=f"{_FIELD} prompt token ids.")] = None,
    step_field: Annotated[str | None, typer.Option(
        help=f"{_FIELD} the training step (TRL: global_step; default: the framework's own name, else step).")] = None,
    ids_only: Annotated[bool, typer.Option(
        "--ids-only", help="jsonl/parquet: import token ids without log-probs (then rcdiag score --rescore-both); "
                           "without it a dump with no log-prob field is refused.")] = _D.ids_only,
    overwrite: Annotated[bool, typer.Option("--overwrite", help="Replace an existing --out run.")] = _D.overwrite,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No progress bar.")] = _D.quiet,
    engine_dtype: Annotated[str | None, typer.Option(
        help="The rollout engine's dtype (bfloat16 | float16 | float32), recorded as engine.engine_dtype.",
        rich_help_panel=_CTX)] = None,
    trainer_dtype: Annotated[str | None, typer.Option(
        help="The dtype the trainer computed its log-probs in.", rich_help_panel=_CTX)] = None,
    quantization: Annotated[str | None, typer.Option(
        help="The engine's weight quantization as vLLM names it (fp8, awq, …).", rich_help_panel=_CTX)] = None,
    kv_cache_dtype: Annotated[str | None, typer.Option(
        help="The engine's KV-cache dtype as vLLM names it (fp8, fp8_e4m3, …).", rich_help_panel=_CTX)] = None,
    temperature: Annotated[float | None, typer.Option(
        help="The sampling temperature (rescoring then uses it).", rich_help_panel=_CTX)] = None,
    top_p: Annotated[float | None, typer.Option(help="The sampling top-p.", rich_help_panel=_CTX)] = None,
    top_k: Annotated[int | None, typer.Option(help="The sampling top-k (≤ 0: off).", rich_help_panel=_CTX)] = None,
    model: Annotated[str | None, typer.Option(
        help="The policy's model directory: its config.json gives the architecture (dense/MoE). Without it, "
             "--tokenizer's config.json where there is one.", rich_help_panel=_CTX)] = None,
    architecture: Annotated[str | None, typer.Option(
        help="dense | moe, where no config says.", rich_help_panel=_CTX)] = None,
    trainer_setting: Annotated[list[str] | None, typer.Option(
        "--trainer-setting", metavar="NAME=VALUE", help="The trainer's own correction setting in its framework's "
        "names (repeatable): TRL vllm_importance_sampling_mode=… / _clip_max=…, verl rollout_is=token / "
        "rollout_is_threshold=2, ms-swift rollout_importance_sampling_mode=…, slime use_tis=true / tis_clip=2. "
        "Report and export then default to it.", rich_help_panel=_CTX)] = None,
) -> None:
    """Import rollouts from slime/miles, verl, generic JSONL/Parquet, TRL or ms-swift into a run directory.

    The manifest records the source format, its padding/mask/placeholder conventions and what the source lacks;
    the same is printed. A failed import leaves nothing behind. Without a --*-field flag, jsonl/parquet rows are
    read by the trainers' own batch key names (TRL completion_ids/sampling_per_token_logps/old_per_token_logps/
    global_step, verl responses/rollout_log_probs/old_log_probs, OpenRLHF sequences/action_mask, ms-swift
    completion_mask/rollout_per_token_logps, AReaL, TRL async), else common names (response_ids, logprobs, mask…).

    Examples:

        rcdiag import slime dump_dir/ --out runs/slime --allow-pickle      # a --dump-details DIR: both sides

        rcdiag import verl ~/.verl/rollout_dump/exp/ --out runs/verl --allow-pickle

        rcdiag import jsonl rollouts.jsonl --out runs/mine --response-ids-field completion_ids --rollout-logprobs-field logprobs

        rcdiag import jsonl trl_batch.jsonl --out runs/trl --tokenizer ./model    # TRL's own keys, steps from global_step

        rcdiag import trl outputs/completions/ --out runs/trl --tokenizer ./model    # then: rcdiag score --rescore-both runs/trl
    """
    try:  # a bad context option is a usage error, found before the dump is read
        context = ImportContext(engine_dtype=engine_dtype, trainer_dtype=trainer_dtype, quantization=quantization,
                                kv_cache_dtype=kv_cache_dtype, temperature=temperature, top_p=top_p, top_k=top_k,
                                architecture=architecture, model=model, trainer_settings=tuple(trainer_setting or ()))
    except ConfigError as exc:
        raise typer.BadParameter(str(exc)) from None
    options = ImportOptions(allow_pickle=allow_pickle, tokenizer=tokenizer, train_path=train_data,
                            response_ids_field=response_ids_field, rollout_logprobs_field=rollout_logprobs_field,
                            train_logprobs_field=train_logprobs_field, mask_field=mask_field,
                            prompt_ids_field=prompt_ids_field, step_field=step_field, ids_only=ids_only,
                            overwrite=overwrite, quiet=quiet, context=context)
    start = time.perf_counter()
    run, imported = import_run(fmt, path, out, options)
    for line in summary_lines(imported, run):
        typer.echo(line)
    typer.echo(f"  took {time.perf_counter() - start:.1f} s")
    typer.echo(_next_step(imported, run.path))


def _next_step(imported: Imported, run: Path) -> str:
    """The one command to run next, from what the records hold: no log-probs at all (retokenized text, ids only) →
    replay and rescore both sides; no trainer side (verl's gen batch, a rollout-only log) → rescore it; else the
    report. Never --rescore-both where the engine's sampled log-probs exist: the replay would replace them."""
    rollout = any(r.rollout_logprobs is not None for r in imported.records)
    trainer = any(r.train_logprobs is not None for r in imported.records)
    if not rollout and not trainer:
        return f"Next: rcdiag score --rescore-both {run} --model MODEL   (both sides; then: rcdiag report {run})"
    if not trainer:
        return (f"Next: rcdiag score --rescore-only {run} --train-model MODEL   (the trainer side; then: "
                f"rcdiag report {run})")
    return f"Next: rcdiag report {run}"
