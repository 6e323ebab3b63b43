"""`rcdiag probe`: hold a sample of a run's tokens fixed and recompute their log-probs under a grid of trainer and
engine settings (`rcdiag.probe.factors`), then store per-token results and a summary under RUN/probes/.

    result = run_probe("runs/sample", ProbeConfig(sample=256))
    result.summary["budget"]      # one row per factor: its share of the observed rollout-vs-trainer gap
    result.tokens                 # DataFrame: seq_id, pos, token_id, mask, rollout, reference, <setting>…

Trainer settings reuse `rcdiag.score.scoring` (load_model / score_sequences); engine settings build one vLLM engine
per (dtype, prefix caching) with `rcdiag.score.engine` — one at a time, each closed before the next — and replay the
tokens with `rcdiag.probe.replay` (over `rcdiag.score.replay.replay_logprobs`). Metrics and the budget are in `rcdiag.probe.summary`.
"""
from __future__ import annotations

import contextlib
import gc
import os
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from rcdiag.errors import ConfigError, RunDirError
from rcdiag.probe.divergence import DivergenceCollector
from rcdiag.probe.factors import (
    DEFAULT_FACTORS,
    ENGINE_RUN,
    GRIDS,
    REFERENCE,
    ROLLOUT,
    ROUTER_FACTORS,
    TRAINER_FACTORS,
    EngineSetting,
    Setting,
    TrainSetting,
    check_factors,
    select_settings,
)
from rcdiag.probe.files import write_probe
from rcdiag.probe.routing import ProbeRouting, load_routing, routing_record, select_routed
from rcdiag.progress import progress
from rcdiag.score.config import check_device_name
from rcdiag.score.engine import EngineSettings, engine_session
from rcdiag.score.rescore import run_temperature, shard_pairs
from rcdiag.score.routes import moe_shape
from rcdiag.store.manifest import Engine
from rcdiag.store.run import Run, open_run

Pair = tuple[np.ndarray, np.ndarray]


@dataclass(frozen=True)
class ProbeConfig:
    """Settings of a probe (the CLI reads its defaults from here)."""

    sample: int = 256
    """Sequences drawn (without replacement, seeded) from those with a response; all of them when fewer."""
    factors: tuple[str, ...] = DEFAULT_FACTORS
    seed: int = 0
    name: str = "probe"
    """Output files: RUN/probes/<name>.parquet and <name>.json."""
    train_model: str | None = None
    """Trainer model directory; None: the run's engine model."""
    device: str = "auto"
    """Trainer device: auto (cuda when available) | cpu | cuda | cuda:N, resolved before any engine starts."""
    threads: int | None = None
    """torch threads for the trainer side (None: leave torch's default)."""
    grid: str = "auto"
    """quick | full | auto (quick for the default factors on CPU, full otherwise): rcdiag.probe.factors.
    QUICK_SETTINGS."""
    divergence_positions: int = 512
    """Positions (whole sequences first, then a seeded sample) whose full distributions are compared by the
    `divergence` factor; 0 turns it off."""

    def __post_init__(self) -> None:
        if int(self.sample) < 1:
            raise ConfigError(f"--sample must be ≥ 1, got {self.sample}")
        if not self.name or any(c in self.name for c in "/\\") or self.name.startswith("."):
            raise ConfigError(f"--name {self.name!r}: use a plain file name (no slashes, not starting with '.')")
        object.__setattr__(self, "factors", tuple(self.factors))
        check_factors(self.factors)  # a mistyped factor fails at construction, before any run or model opens
        object.__setattr__(self, "device", check_device_name(self.device))
        if self.grid not in GRIDS:
            raise ConfigError(f"--grid {self.grid!r} is not one of {', '.join(GRIDS)}")
        if int(self.divergence_positions) < 0:
            raise ConfigError(f"--divergence-positions must be ≥ 0, got {self.divergence_positions}")


@dataclass
class ProbeResult:
    """A finished probe: the summary dict (also written as JSON), the per-token frame, and the files written."""

    summary: dict[str, Any]
    tokens: pd.DataFrame
    files: list[Path] = field(default_factory=list)


# --------------------------------------------------------------------------------------------------- sample
def sample_tokens(run: Run, n: int, seed: int, vocab_size: int, max_context: int | None,
                  ) -> tuple[pd.DataFrame, list[Pair]]:
    """Draw up to `n` sequences with a response (seeded, sorted by seq_id): their token rows (seq_id, pos,
    token_id, mask, rollout) and validated (prompt ids, response ids) pairs in the same order."""
    candidates = np.unique(np.asarray(run.token_table(["seq_id"]).column("seq_id"), dtype=np.int64))
    if candidates.size == 0:
        raise RunDirError(f"{run.path}: no sequence has response tokens; nothing to probe")
    rng = np.random.default_rng(seed)
    chosen = np.sort(rng.choice(candidates, size=min(n, candidates.size), replace=False))
    # only the chosen sequences' rows are read (Parquet filters), never the whole token table
    sequences = run.sequence_table(["seq_id", "prompt_token_ids", "response_len"], seq_ids=chosen)
    tokens = run.token_table(["seq_id", "pos", "token_id", "rollout_logprob", "mask"], seq_ids=chosen)
    pairs = shard_pairs(tokens, sequences, source="tokens", vocab_size=vocab_size, max_context=max_context)
    frame = tokens.to_pandas().rename(columns={"rollout_logprob": ROLLOUT})
    return frame, pairs


# --------------------------------------------------------------------------------------------------- trainer side
def _score_train(model: Any, setting: TrainSetting, pairs: Sequence[Pair], temperature: float,
                 bar: Any, on_logits: Callable[[np.ndarray, Any], None] | None = None,
                 routing: ProbeRouting | None = None) -> tuple[np.ndarray, np.ndarray | None]:
    """(flat float32 `[N]` log-probs of every response token under one trainer setting, their routes `[N, L, k]`
    on an MoE probe, else None); `on_logits(flat indices, logits)` sees the LM head's chunks (one-at-a-time
    settings only). `routing` (an MoE probe): the routers' hooks record routes, force the engine's (`routes`) or
    recompute the router in `router_dtype`."""
    from rcdiag.score.routes import RouteHooks
    from rcdiag.score.scoring import score_sequences

    hooks = None if routing is None else RouteHooks(model, routing.shape, router_dtype=setting.router_dtype)
    forced = routing.forced if routing is not None and setting.routes == "engine" else None
    routes: list[np.ndarray] = []
    with hooks or contextlib.nullcontext():
        if setting.token_budget is None:  # one sequence per forward
            parts, offset = [], 0
            for i, pair in enumerate(pairs):
                hook = None if on_logits is None else (lambda idx, logits, off=offset: on_logits(idx + off, logits))
                if hooks is not None:
                    hooks.forced = None if forced is None else [forced[i]]
                parts.append(score_sequences(model, [pair], temperature=temperature, token_budget=1 << 30,
                                             chunk_tokens=setting.chunk_tokens, on_logits=hook,
                                             routes=hooks).logprobs)
                if hooks is not None:
                    routes.append(hooks.ids)
                offset += len(pair[1])
                bar.update(len(pair[1]))
            logprobs = np.concatenate(parts) if parts else np.zeros(0, dtype=np.float32)
        else:
            if hooks is not None:
                hooks.forced = forced
            scored = score_sequences(model, pairs, temperature=temperature, token_budget=setting.token_budget,
                                     chunk_tokens=setting.chunk_tokens, routes=hooks)
            bar.update(int(scored.cu_seqlens[-1]))
            logprobs = scored.logprobs
            if hooks is not None:
                routes.append(hooks.ids)
    return logprobs, (np.concatenate(routes) if routes else None)


def trainer_pass(model_path: str, settings: Sequence[TrainSetting], pairs: Sequence[Pair], temperature: float,
                 device: str, steps: Steps, collector: DivergenceCollector | None = None,
                 routing: ProbeRouting | None = None, routes: dict[str, np.ndarray] | None = None,
                 ) -> dict[str, np.ndarray]:
    """Log-probs per trainer setting; one model load per dtype (freed before the next), its attention
    implementation switched in place between settings (the weights are the same tensors, so the numbers are those
    of a fresh load with that attention; a load per (dtype, attention) cost a load and a gc per switch). On an MoE
    probe (`routing`), each setting's routes go into `routes`."""
    import warnings

    from rcdiag.score.attention import resolve_attention
    from rcdiag.score.scoring import RescoreWarning, attention_used, load_model

    out: dict[str, np.ndarray] = {}
    groups: dict[str, list[TrainSetting]] = {}
    for setting in settings:
        groups.setdefault(setting.dtype, []).append(setting)
    n_tokens = sum(len(r) for _, r in pairs)
    for dtype, members in groups.items():
        order = {attn: i for i, attn in enumerate(dict.fromkeys(s.attn for s in members))}
        members.sort(key=lambda s: order[s.attn])  # stable: one switch per attention implementation
        steps.say(f"trainer: loading {Path(model_path).name} in {dtype} with {members[0].attn} attention")
        model = load_model(model_path, dtype=dtype, device=device, attn=members[0].attn)
        for setting in members:
            impl = resolve_attention(setting.attn, device, model.config)
            if impl != attention_used(model):
                steps.say(f"trainer: {dtype} model switched to {setting.attn} attention")
                model.set_attn_implementation(impl)
            hook = collector.on_logits if collector is not None and setting.name == REFERENCE else None
            with steps.bar(setting.name, n_tokens) as bar, warnings.catch_warnings():
                warnings.simplefilter("ignore", RescoreWarning)
                out[setting.name], found = _score_train(model, setting, pairs, temperature, bar, hook, routing)
                if routes is not None and found is not None:
                    routes[setting.name] = found
        del model
        gc.collect()
    return out


# --------------------------------------------------------------------------------------------------- engine side
def engine_model(run: Run) -> str:
    """The run's engine model directory; ConfigError (naming the fix) when it is not a local model directory."""
    model = run.info.engine_model
    if model is None or not (Path(model) / "config.json").is_file():
        raise ConfigError(f"{run.path}: the engine model {model!r} is not a local model directory; engine factors "
                          f"need it (probe only trainer factors with --factors {','.join(TRAINER_FACTORS)})")
    return model


def engine_pass(run: Run, settings: Sequence[EngineSetting], pairs: Sequence[Pair], temperature: float,
                llm: Any, steps: Steps, collector: DivergenceCollector | None = None,
                ) -> tuple[dict[str, np.ndarray], dict[str, dict[str, Any]]]:
    """(replayed log-probs per engine setting, engine facts per setting: dtype, prefix caching, tokens and
    prefix-cache hits). One engine per (dtype, prefix caching), each closed before the next. `llm` (optional,
    caller-owned) serves the settings matching the run's own engine. With a `collector`, the engine at the run's
    settings and at the other dtype also return whole distributions at the collector's positions."""
    from rcdiag.probe.replay import replay_cached, replay_distributions, replay_pairs

    engine = run.info.engine or Engine()
    model = engine_model(run)
    recorded = {name: value for name, value in (("seed", engine.seed), ("max_model_len", engine.max_model_len),
                                                ("gpu_memory_utilization", engine.gpu_memory_utilization))
                if value is not None}  # the rest: EngineSettings' own defaults
    run_dtype = str(engine.requested_dtype or "auto")
    run_caching = EngineSettings.enable_prefix_caching if engine.enable_prefix_caching is None \
        else engine.enable_prefix_caching
    resolved = str(engine.dtype_resolved or run_dtype)
    groups: dict[tuple[str, bool], list[EngineSetting]] = {}
    for setting in settings:
        groups.setdefault(setting.engine_key(run_dtype, run_caching), []).append(setting)
    n_tokens = sum(len(r) for _, r in pairs)
    out: dict[str, np.ndarray] = {}
    facts: dict[str, dict[str, Any]] = {}
    for (dtype, caching), members in groups.items():
        own = llm if (llm is not None and (dtype, caching) == (run_dtype, run_caching)) else None
        steps.say(f"engine: {'using the given' if own else 'building a'} vLLM engine "
                  f"({dtype if dtype != 'auto' else resolved}, prefix caching {'on' if caching else 'off'})")
        spec = EngineSettings(model=model, dtype=dtype, enable_prefix_caching=caching, **recorded)
        with engine_session(spec, own) as session:
            for setting in members:
                stats: dict[str, Any] = {"tokens": sum(len(p) + len(r) for p, r in pairs), "cached_tokens": 0}
                with steps.bar(setting.name, n_tokens) as bar:
                    if setting.read_prefix_cache:
                        stats = {}
                        values = replay_cached(session, pairs, temperature, on_done=bar.update, stats=stats)
                    else:
                        values = replay_pairs(session, pairs, temperature, one_at_a_time=setting.one_at_a_time,
                                              on_done=bar.update)
                out[setting.name] = np.concatenate(values) if values else np.zeros(0, dtype=np.float32)
                facts[setting.name] = {**stats, "dtype": dtype if dtype != "auto" else resolved,
                                       "enable_prefix_caching": caching, "built": own is None,
                                       "block_size": _block_size(session)}
                if collector is not None and setting.factor in ("engine_numerics", "engine_dtype"):
                    with steps.bar(f"{setting.name} distributions", int(collector.flat.size)) as bar:
                        replay_distributions(session, pairs, collector.per_pair, temperature,
                                             collector.engine_rows(setting.name), on_done=bar.update)
        gc.collect()
    return out, facts


def _block_size(llm: Any) -> int | None:
    """The KV-cache block size of an engine (prefix caching works in whole blocks), None when unknown."""
    config = getattr(getattr(llm, "llm_engine", None), "vllm_config", None)
    return getattr(getattr(config, "cache_config", None), "block_size", None)


# --------------------------------------------------------------------------------------------------- entry point
def run_probe(run_path: str | os.PathLike, config: ProbeConfig = ProbeConfig(), *, llm: Any = None,
              silent: bool = False, write: bool = True) -> ProbeResult:
    """Probe a run: recompute the sampled tokens' log-probs under every selected setting, summarise, store.

    Writes RUN/probes/<name>.parquet (one row per sampled token, one float32 column per setting) and
    RUN/probes/<name>.json (the summary; `rcdiag.probe.summary.summarize`) atomically, unless `write=False`.
    Refusals (unknown factor, missing model, bad tokens) happen before any model work.
    """
    from rcdiag.probe.summary import summarize
    from rcdiag.score.devices import resolve_device
    from rcdiag.score.scoring import load_config, model_limits

    started = time.time()
    device = resolve_device(config.device)  # before any engine starts
    run = open_run(run_path)
    temperature = run_temperature(run.info)
    model_path = config.train_model or run.info.engine_model
    if model_path is None:
        raise ConfigError(f"{run.path}: the manifest names no model; pass --train-model")
    model_config = load_config(model_path)
    vocab_size, max_context = model_limits(model_config)
    run_engine = run.info.engine or Engine()
    run_dtype = str(run_engine.dtype_resolved or "auto")
    quick = config.grid == "quick" or (config.grid == "auto" and device == "cpu"
                                       and tuple(config.factors) == DEFAULT_FACTORS)  # chosen factors: all of them
    settings = select_settings(config.factors, run_dtype, quick)
    shape = moe_shape(model_config) if any(f in ROUTER_FACTORS for f in config.factors) else None
    settings, skipped = select_routed(settings, shape, run, model_path)
    engine = [s for s in settings if isinstance(s, EngineSetting)]
    if engine:
        engine_model(run)  # refuse before any model work
    frame, pairs = sample_tokens(run, config.sample, config.seed, vocab_size, max_context)
    routing = None
    if shape is not None and any(isinstance(s, TrainSetting) and s.routed for s in settings):
        replay = [s for s in settings if isinstance(s, TrainSetting) and s.routes is not None]
        routing = load_routing(run, frame, pairs, shape, bool(replay))
        if replay and routing.forced is None:
            settings = [s for s in settings if s not in replay]
        skipped += routing.notes
    collector = None
    if "divergence" in config.factors and config.divergence_positions and engine:
        collector = DivergenceCollector(pairs, config.divergence_positions, config.seed, vocab_size,
                                        top_p=float(run_engine.top_p or 1.0), top_k=run_engine.top_k)
    distributions = 0 if collector is None else sum(s.factor in ("engine_numerics", "engine_dtype") for s in engine)
    steps = Steps(len(settings) + distributions, silent)
    for note in skipped:
        steps.say(f"note: {note}")
    steps.say(f"probe {config.name}: {len(pairs)} sequences, {len(frame):,} tokens, temperature {temperature:g}, "
              f"{len(settings)} settings ({'quick' if quick else 'full'} grid)"
              + (f", whole distributions at {collector.flat.size:,} positions" if collector else ""))
    if config.threads:
        import torch

        torch.set_num_threads(config.threads)
    # vLLM first: building a vLLM CPU engine after transformers has loaded a model in the same process fails in
    # vLLM 0.32's kernel dispatcher (AttributeError in register_triton_kernel_overrides); `rcdiag score` has the
    # same order.
    values: dict[str, np.ndarray] = {}
    facts: dict[str, dict[str, Any]] = {}
    try:
        if engine:
            values, facts = engine_pass(run, engine, pairs, temperature, llm, steps, collector)
        train = [s for s in settings if isinstance(s, TrainSetting)]
        routes: dict[str, np.ndarray] = {}
        values.update(trainer_pass(model_path, train, pairs, temperature, device, steps, collector, routing, routes))
        for setting in settings:
            bad = int((~np.isfinite(values[setting.name])).sum())
            if bad:
                raise RuntimeError(f"probe setting {setting.name} produced {bad} non-finite log-prob(s) of "
                                   f"{len(frame):,}; please report it with the run's manifest")
            frame[setting.name] = values[setting.name]
        divergence = None
        if collector is not None:
            divergence = collector.results(frame, {name: name for name in collector.engine})
            if ENGINE_RUN in collector.engine:
                for name, column in collector.columns(ENGINE_RUN, len(frame)).items():
                    frame[name] = column
    finally:
        if collector is not None:
            collector.close()
    summary = summarize(frame, settings, run=run, config=config, temperature=temperature, engine_facts=facts,
                        seconds=time.time() - started, divergence=divergence, device=device,
                        grid="quick" if quick else "full", extra_notes=skipped,
                        routing=None if routing is None else routing_record(routing, routes, run))
    result = ProbeResult(summary=summary, tokens=frame)
    if write:
        result.files = write_probe(run.path, config.name, frame, summary)
        steps.say(f"wrote {', '.join(str(f) for f in result.files)}")
    return result


class Steps:
    """The probe's overall progress: each setting's bar reads `[k/N] name`, and each finished step prints how long
    it took and about how long the rest will take (the mean time per step so far × the steps left)."""

    def __init__(self, total: int, silent: bool) -> None:
        self.total, self.silent, self.k, self.started = total, silent, 0, time.perf_counter()

    def say(self, text: str) -> None:
        if not self.silent:
            from tqdm.auto import tqdm

            tqdm.write(text)

    @contextlib.contextmanager
    def bar(self, name: str, total: int) -> Iterator[Any]:
        self.k += 1
        began = time.perf_counter()
        with progress(total=total, desc=f"[{self.k}/{self.total}] {name}", unit="tok", unit_scale=True,
                      silent=self.silent) as bar:
            yield bar
        elapsed = time.perf_counter() - self.started
        left = max(self.total - self.k, 0) * elapsed / self.k
        self.say(f"[{self.k}/{self.total}] {name}: {time.perf_counter() - began:.0f} s"
                 + (f"; about {_duration(left)} left" if left else ""))


def _duration(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 90 else f"{seconds / 60:.0f} min"


__all__ = ["ProbeConfig", "ProbeResult", "run_probe", "sample_tokens", "Setting", "REFERENCE"]
