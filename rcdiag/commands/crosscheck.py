"""`rcdiag crosscheck`: the trainer's logged rollout-correction curves against a recomputation from the run."""
from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from rcdiag.analysis.defaults import DEFAULT_THRESHOLD
from rcdiag.analysis.keys import KEY_STYLES
from rcdiag.analysis.training.trend import DEFAULT_MODE
from rcdiag.errors import ConfigError
from rcdiag.trackers.crosscheck import COLUMNS, DEFAULT_ATOL, DEFAULT_RTOL, crosscheck
from rcdiag.trackers.export import check_table_dest

SHOWN = 20
"""Disagreeing values printed (all are in --out)."""


def command(
    run: Annotated[Path, typer.Argument(help="Run directory (the same rollouts the trainer logged).")],
    tensorboard: Annotated[Path | None, typer.Option("--tensorboard", help="The trainer's TensorBoard log dir.")
                           ] = None,
    wandb: Annotated[Path | None, typer.Option("--wandb", help="An offline W&B run (dir or .wandb file).")] = None,
    csv: Annotated[Path | None, typer.Option("--csv", help="A CSV of the trainer's history (step column).")] = None,
    keys: Annotated[str | None, typer.Option(
        "--keys", help=f"{' | '.join(KEY_STYLES)} (default: guessed from the logged names).")] = None,
    mode: Annotated[str, typer.Option("--mode", help="The trainer's IS mode.")] = DEFAULT_MODE,
    threshold: Annotated[float, typer.Option("--threshold", help="The trainer's IS threshold C.")] = DEFAULT_THRESHOLD,
    lower: Annotated[float | None, typer.Option("--lower", help="The trainer's lower bound L.")] = None,
    rtol: Annotated[float, typer.Option("--rtol", help="Relative tolerance.")] = DEFAULT_RTOL,
    atol: Annotated[float, typer.Option("--atol", help="Absolute tolerance.")] = DEFAULT_ATOL,
    step_offset: Annotated[int, typer.Option(
        "--step-offset", help="Logged step = run step + this (1 when the trainer counts steps from 1, as verl).")] = 0,
    out: Annotated[Path | None, typer.Option("--out", help="Write every compared value as CSV here.")] = None,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="Only the verdict line.")] = False,
) -> None:
    """Read the trainer's logged rollout-correction scalars (rollout_corr/…, rollout_correction/…, sampling/…,
    also under a prefix such as actor/), recompute each from the run under that framework's convention step by
    step, and list where they disagree beyond |Δ| ≤ atol + rtol·|logged|. Exit 1 when any value disagrees
    (a logging bug, a wrong temperature or mask shows up here first), when logged values are missing between
    logged steps, or when the log is damaged (every record's checksum is verified); 0 when all agree. A curve
    that fits one step over is named (verl counts steps from 1: --step-offset 1).

    Examples:

        rcdiag crosscheck runs/steps --tensorboard outputs/tb --keys verl --threshold 2

        rcdiag crosscheck runs/steps --wandb wandb/offline-run-20260101_000000-abc123

        rcdiag crosscheck runs/steps --csv history.csv --keys trl --mode sequence_mask --threshold 3
    """
    given = [(k, p) for k, p in (("tensorboard", tensorboard), ("wandb", wandb), ("csv", csv)) if p is not None]
    if len(given) != 1:
        raise ConfigError("give exactly one of --tensorboard LOGDIR, --wandb RUN_DIR, --csv FILE")
    kind, source = given[0]
    if out is not None:  # before the pass: a file rcdiag did not write is never replaced
        check_table_dest(out, "csv", COLUMNS, option="--out")
    result = crosscheck(run, source, kind, keys, mode=mode, threshold=threshold, lower=lower, rtol=rtol, atol=atol,
                        step_offset=step_offset, silent=quiet)
    if out is not None:
        tmp = out.with_name(f".{out.name}.tmp")
        result.table.to_csv(tmp, index=False)
        tmp.replace(out)
    typer.echo(result.summary())
    if not quiet:
        bad = result.disagreements
        for row in bad.head(SHOWN).itertuples(index=False):
            typer.echo(f"  step {row.step}: {row.key} logged {row.logged:.6g}, recomputed {row.recomputed:.6g} "
                       f"(|Δ| {row.abs_diff:.3g}, {row.rel_diff:.2%})")
        if len(bad) > SHOWN:
            typer.echo(f"  … {len(bad) - SHOWN} more (--out FILE lists all)")
        if result.only_logged:
            typer.echo(f"  logged steps not in the run (not compared): {result.only_logged[:10]}")
        if result.not_recomputed:
            typer.echo(f"  logged keys rcdiag does not recompute: {', '.join(result.not_recomputed[:8])}")
    if result.failed:
        raise typer.Exit(1)
