"""`rcdiag score`: generate rollouts with vLLM (stage 1), then rescore them with transformers (stage 2)."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Any

import typer

from rcdiag.distributed import RAY_HELP
from rcdiag.errors import ConfigError
from rcdiag.score.config import GenerateConfig, RescoreConfig

_G = GenerateConfig()
_GEN = "Generation (vLLM)"
_TRAIN = "Rescoring (transformers)"
_RUN = "Run"
_RD = "[default: RescoreConfig's, see `rcdiag.score.rescore`]"


def _rescore_config(options: dict[str, Any]) -> Any:
    """RescoreConfig from the options given; unset ones keep RescoreConfig's defaults (kept in one place)."""
    return RescoreConfig(**{k: v for k, v in options.items() if v is not None})


def _rescore(run: Path, options: dict[str, Any], quiet: bool) -> dict[str, Any]:
    from rcdiag.score.rescore import rescore_run

    return rescore_run(run, _rescore_config(options), silent=quiet)


def _summary(run: Path) -> str:
    from rcdiag.store.run import open_run

    opened = open_run(run)
    counts = opened.manifest.get("counts", {})
    stages = "generated" + (" + rescored" if "trainer" in opened.manifest else "")
    return (f"{run}: {counts.get('sequences')} sequences, {counts.get('tokens')} tokens in "
            f"{counts.get('shards')} shard(s) ({stages})")


_ENGINE_OPTIONS = ("temperature", "seed", "engine_dtype", "gpu_memory_utilization", "enable_prefix_caching",
                   "max_model_len", "trust_remote_code")


def _engine_options(options: dict[str, Any]) -> dict[str, Any]:
    return {name: options[name] for name in _ENGINE_OPTIONS}


def _rescore_both(run: Path, model: Path | None, train: dict[str, Any], config: GenerateConfig, overwrite: bool,
                  quiet: bool) -> None:
    """Replay the run's tokens through vLLM for rollout_logprob (closing it after), then rescore them."""
    from rcdiag.score.replay import replay_run
    from rcdiag.score.rescore import engine_model_path
    from rcdiag.store.run import open_run

    engine_model = model or engine_model_path(open_run(run).manifest)
    if engine_model is None:
        raise ConfigError(f"{run}: the manifest names no engine model; pass --model")
    _rescore_config(train)
    replay_run(run, engine_model, config, overwrite=overwrite, silent=quiet)
    _rescore(run, {**train, "train_model": train["train_model"] or str(engine_model)}, quiet)
    typer.echo(_summary(run))


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
    temperature: Annotated[float, typer.Option(rich_help_panel=_GEN)] = _G.temperature,
    top_p: Annotated[float, typer.Option(help="< 1 needs --allow-truncated-sampling.",
                                         rich_help_panel=_GEN)] = _G.top_p,
    top_k: Annotated[int | None, typer.Option(help="Set (> 0) needs --allow-truncated-sampling.",
                                              rich_help_panel=_GEN)] = _G.top_k,
    max_tokens: Annotated[int, typer.Option(help="Max response tokens.", rich_help_panel=_GEN)] = _G.max_tokens,
    seed: Annotated[int, typer.Option(help="Base seed (each prompt×sample request gets its own seed from it).",
                                      rich_help_panel=_GEN)] = _G.seed,
    engine_dtype: Annotated[str, typer.Option(help="auto | bfloat16 | float16 | float32.",
                                              rich_help_panel=_GEN)] = _G.engine_dtype,
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
                                                    rich_help_panel=_TRAIN)] = None,
    train_dtype: Annotated[str | None, typer.Option(help=f"float32 | bfloat16 | float16. {_RD}",
                                                    rich_help_panel=_TRAIN)] = None,
    device: Annotated[str | None, typer.Option(help=f"cpu | cuda | cuda:N. {_RD}",
                                               rich_help_panel=_TRAIN)] = None,
    token_budget: Annotated[int | None, typer.Option(help=f"Tokens per packed row. {_RD}",
                                                     rich_help_panel=_TRAIN)] = None,
    chunk_tokens: Annotated[int | None, typer.Option(help=f"Positions per LM-head chunk. {_RD}",
                                                     rich_help_panel=_TRAIN)] = None,
    attn: Annotated[str | None, typer.Option(help=f"auto | sdpa_varlen | flash_attention_2 | sdpa | "
                                             f"flex_attention | eager. {_RD}", rich_help_panel=_TRAIN)] = None,
    generate_only: Annotated[bool, typer.Option("--generate-only", help="Stop after stage 1.")] = False,
    rescore_only: Annotated[Path | None, typer.Option(
        "--rescore-only", metavar="RUN", help="Skip stage 1: rescore an existing run.")] = None,
    rescore_both: Annotated[Path | None, typer.Option(
        "--rescore-both", metavar="RUN", help="Imported/retokenized run: replay its tokens through vLLM (--model, "
        "--temperature) for rollout_logprob, then rescore.")] = None,
    trust_remote_code: Annotated[bool, typer.Option("--trust-remote-code",
                                                    help="Run model code shipped with the model.")] = False,
    overwrite: Annotated[bool, typer.Option("--overwrite", help="Replace a run made with other settings.")] = False,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No progress bars, vLLM warnings only.")] = False,
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

        rcdiag score -m ./model -p prompts.jsonl -o s3://bucket/runs/q05 --ray auto --engines 8   # on a Ray cluster
    """
    if quiet:
        os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    train = {"train_model": train_model, "train_dtype": train_dtype, "device": device,
             "token_budget": token_budget, "chunk_tokens": chunk_tokens, "attn": attn,
             "trust_remote_code": trust_remote_code}
    if rescore_only is not None:
        _rescore(rescore_only, train, quiet)
        typer.echo(_summary(rescore_only))
        return
    if rescore_both is not None:
        _rescore_both(rescore_both, model, train, GenerateConfig(**_engine_options(locals())), overwrite, quiet)
        return
    missing = [flag for flag, value in (("--model", model), ("--prompts", prompts), ("--out", out)) if value is None]
    if missing:
        raise ConfigError(f"{', '.join(missing)} required (or --rescore-only RUN to rescore an existing run)")
    config = GenerateConfig(**_engine_options(locals()), n=n, top_p=top_p, top_k=top_k, max_tokens=max_tokens,
                            allow_truncated_sampling=allow_truncated_sampling, limit=limit,
                            prompt_field=prompt_field, shard_prompts=shard_prompts)
    if not generate_only:
        _rescore_config(train)  # refuse bad stage-2 options before stage 1 runs
    if ray is not None:
        from rcdiag.distributed.score import score_command

        typer.echo(score_command(model, prompts, out, config, _rescore_config(train), ray, (engines, rescorers),
                                 overwrite, quiet, generate_only))
        return
    from rcdiag.score.generate import generate_run

    generate_run(model, prompts, out, config, overwrite=overwrite, silent=quiet)
    if not generate_only:
        _rescore(out, {**train, "train_model": train_model or str(model)}, quiet)
    typer.echo(_summary(out))
