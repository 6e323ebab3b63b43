"""`rcdiag probe`: recompute a run's sampled tokens under a grid of trainer/engine settings; attribute the gap."""
from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated

import typer

from rcdiag.errors import ConfigError
from rcdiag.probe.answer import answer_lines
from rcdiag.probe.factors import FACTORS
from rcdiag.probe.run import ProbeConfig, run_probe
from rcdiag.score.config import DEVICE_HELP
from rcdiag.score.engine import set_vllm_logging

DEFAULTS = ProbeConfig()


def _factors(text: str | None) -> tuple[str, ...]:
    if text is None:
        return DEFAULTS.factors
    return tuple(f.strip() for f in text.split(",") if f.strip())


def command(
    run: Annotated[Path, typer.Argument(help="Run directory (from `rcdiag score` or an import with token ids).")],
    sample: Annotated[int, typer.Option("--sample", help="Sequences to probe (seeded draw).")] = DEFAULTS.sample,
    factors: Annotated[str | None, typer.Option(
        "--factors", help=f"Comma-separated factors [default: {', '.join(DEFAULTS.factors)}]; all: "
        f"{', '.join(FACTORS)}.")] = None,
    name: Annotated[str, typer.Option("--name", help="Writes RUN/probes/NAME.parquet and NAME.json.")
                    ] = DEFAULTS.name,
    seed: Annotated[int, typer.Option("--seed", help="Seed of the sequence sample.")] = DEFAULTS.seed,
    train_model: Annotated[str | None, typer.Option(
        "--train-model", help="Trainer model directory (default: the run's engine model).")] = None,
    device: Annotated[str, typer.Option("--device", help=f"Trainer device: {DEVICE_HELP}.")] = DEFAULTS.device,
    threads: Annotated[int | None, typer.Option("--threads", help="torch threads for the trainer side.")] = None,
    grid: Annotated[str, typer.Option("--grid", help="quick (one setting per question) | full | auto: quick on "
                                      "CPU, full on CUDA.")] = DEFAULTS.grid,
    divergence_positions: Annotated[int, typer.Option(
        "--divergence-positions", help="Positions whose whole next-token distributions are compared (exact KL "
        "both ways, TV, JS, top-k overlap, kept mass); 0: off.")] = DEFAULTS.divergence_positions,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No progress bars or summary.")] = False,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Show vLLM's INFO log (default: warnings).")
                       ] = False,
) -> None:
    """Hold a sample of a run's tokens fixed and recompute their log-probs under a grid of settings, then say how
    much of the observed rollout-vs-trainer gap each factor explains (the mismatch budget).

    Trainer side (transformers, padding-free): dtype float32/bfloat16/float16, attention implementation,
    packing (alone vs packed rows of 512/4096 tokens), LM-head chunk size. Engine side (vLLM replaying the fixed
    tokens by prefill with prompt log-probs): the run's own settings, another dtype, responses scored against a
    cached prompt (prefix caching), one request per batch (batch invariance), and decode vs prefill (the
    run's sampled log-probs against the replay). The reference is the float32 trainer, one sequence at a time.

    Each setting's distance (kl, k3_kl, mean/p99/max |ℓ|, share of |ℓ| > 0.1) to its baseline, the reference
    and the rollout goes to RUN/probes/NAME.json; per-token log-probs to RUN/probes/NAME.parquet.
    `rcdiag report` and the dashboard's Probes page show the latest probe.

    Examples:

        rcdiag probe runs/sample

        rcdiag probe runs/sample --sample 64 --factors train_dtype,packing --name quick

        rcdiag probe runs/q05 --factors engine_numerics,decode_vs_prefill,batch_invariance --name engine
    """
    try:  # a bad option is a usage error (exit 2 with the usage line), found before any run or model is opened
        config = ProbeConfig(sample=sample, factors=_factors(factors), seed=seed, name=name,
                             train_model=train_model, device=device, threads=threads, grid=grid,
                             divergence_positions=divergence_positions)
    except ConfigError as exc:
        raise typer.BadParameter(str(exc)) from None
    set_vllm_logging(verbose)
    start = time.perf_counter()
    result = run_probe(run, config, silent=quiet)
    if quiet:
        return
    for line in answer_lines(result.summary):
        typer.echo(line)
    typer.echo(f"Wrote {', '.join(str(f) for f in result.files)} in {time.perf_counter() - start:.1f} s")
    typer.echo(f"Next: rcdiag report {run}   (its probe section shows this budget; or rcdiag dashboard {run})")
