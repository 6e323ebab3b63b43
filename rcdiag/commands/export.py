"""`rcdiag export`: a run's per-step mismatch to TensorBoard, an offline W&B run, or a CSV / JSONL table."""
from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from rcdiag.analysis.defaults import DEFAULT_THRESHOLD, IS_MODES
from rcdiag.analysis.keys import KEY_STYLES
from rcdiag.trackers.export import TARGETS, export_run

_FROM = "the run's recorded trainer setting, else the --keys framework's default, else"


def command(
    run: Annotated[Path, typer.Argument(help="Run directory.")],
    to: Annotated[str, typer.Option("--to", help=f"Target: {' | '.join(TARGETS)}.")],
    dest: Annotated[Path, typer.Argument(help="TensorBoard log dir | dir for wandb/offline-run-* | CSV/JSONL file.")],
    keys: Annotated[str, typer.Option(
        "--keys", help=f"Key names (and the convention computing them): {' | '.join(KEY_STYLES)}.")] = "canonical",
    mode: Annotated[str | None, typer.Option(
        "--mode", help=f"IS mode of the IS keys: {' | '.join(IS_MODES)} [default: {_FROM} {IS_MODES[0]}].")] = None,
    threshold: Annotated[float | None, typer.Option(
        "--threshold", help=f"IS threshold C [default: {_FROM} {DEFAULT_THRESHOLD:g}].")] = None,
    lower: Annotated[float | None, typer.Option(
        "--lower", help="Optional lower bound L [default: the run's recorded trainer setting].")] = None,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No progress bar or summary.")] = False,
) -> None:
    """Write the run's per-step metrics as tracker scalars at global_step = step (a run without steps is step 0),
    under the chosen framework's own key names, so they land in the same panels as the trainer's curves:
    verl rollout_corr/…, swift rollout_correction/…, trl sampling/…, canonical rcdiag/… (every metric with its
    interval bounds). TensorBoard and W&B need `pip install 'rcdiag[trackers]'`; W&B is written offline
    (no network) — upload it later with `wandb sync DIR/wandb/offline-run-*`.

    Examples:

        rcdiag export runs/steps --to tensorboard tb/ --keys verl      # then: tensorboard --logdir tb/

        rcdiag export runs/steps --to wandb wb/ --keys swift

        rcdiag export runs/steps --to csv steps.csv
    """
    result = export_run(run, to, dest, keys, mode=mode, threshold=threshold, lower=lower, silent=quiet)
    if not quiet:
        typer.echo(f"Wrote {result.scalars} scalars ({len(result.keys)} keys × {result.steps} step(s)) to "
                   f"{result.path}")
        if result.setting is not None:
            typer.echo(result.setting.sentence())
