"""`rcdiag score` as one library call: generate (stage 1), rescore (stage 2), or replay + rescore an imported run,
with timed phases and a closing summary. The CLI only parses options into GenerateConfig / RescoreConfig and
calls `score_run`; a notebook or script gets the same behaviour and the same summary.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from rcdiag.errors import ConfigError
from rcdiag.progress import Phases
from rcdiag.score.config import GenerateConfig, RescoreConfig
from rcdiag.store.manifest import Manifest, update_manifest
from rcdiag.store.run import Run, open_run


@dataclass(frozen=True)
class ScoreResult:
    """What a `score_run` call left behind: the run, its typed manifest and how long each phase took."""

    run: Path
    info: Manifest
    seconds: dict[str, float] = field(default_factory=dict)

    @property
    def counts(self) -> dict[str, Any]:
        return self.info.counts

    @property
    def rescored(self) -> bool:
        return self.info.trainer is not None and self.info.trainer.model is not None  # rcdiag rescored it

    def stages(self) -> list[str]:
        """What happened to the run's rows, from its manifest (not from which flags were passed): where they came
        from (`source.kind`: "generated" by vLLM, "imported from verl", …), "replayed in the engine" after
        `--rescore-both`, "rescored" once a trainer section exists. A rescore-only call on an imported dump then
        says so, instead of claiming a generation that never ran."""
        kind = self.info.source.kind or "manual"
        origin = ("generated" if kind == "generated" else
                  f"imported from {kind.split(':', 1)[1]}" if kind.startswith("imported:") else f"written ({kind})")
        engine = self.info.engine
        return [origin] + (["replayed in the engine"] if engine is not None and engine.replayed else []) + \
            (["rescored"] if self.rescored else [])

    def one_line(self) -> str:
        """`RUN: 6 sequences, 40 tokens in 1 shard(s) (generated + rescored)` — what --quiet prints."""
        counts = self.counts
        return (f"{self.run}: {counts.get('sequences')} sequences, {counts.get('tokens')} tokens in "
                f"{counts.get('shards')} shard(s) ({' + '.join(self.stages())})")

    def summary_lines(self) -> list[str]:
        """The closing summary: what the run holds, where it is, the time per phase and the next command."""
        counts = self.counts
        done = self.stages()
        stages = ", ".join(done[:-1]) + " and " + done[-1] if len(done) > 1 else done[0]
        stages += "" if self.rescored else ", not rescored yet"
        lines = [f"Done: {counts.get('sequences', '?'):,} sequences, {counts.get('tokens', '?'):,} response tokens "
                 f"in {counts.get('shards', '?')} shard(s), {stages}.",
                 f"  run:  {self.run}"]
        if self.seconds:
            lines.append("  time: " + " · ".join(f"{name} {s:.1f} s" for name, s in self.seconds.items()))
        if self.rescored:
            lines.append(f"Next: rcdiag report {self.run}")
        else:
            lines.append(f"Next: rcdiag score --rescore-only {self.run}   (then: rcdiag report {self.run})")
        return lines


def score_run(out: str | Path, *, model: str | Path | None = None, prompts: str | Path | None = None,
              generate: GenerateConfig = GenerateConfig(), rescore: RescoreConfig | None = RescoreConfig(),
              rescore_only: bool = False, replay: bool = False, overwrite: bool = False, silent: bool = False,
              phases: Phases | None = None, stated: dict[str, Any] | None = None) -> ScoreResult:
    """Run `rcdiag score`'s stages on the run directory `out`.

    - default: generate with vLLM from `model` and `prompts` into `out` (resumed when interrupted), then rescore
      with transformers under `rescore` (None: stop after generation).
    - `rescore_only`: `out` is an existing run; only rescore it. `stated`: what the user says of its engine
      (temperature, engine_dtype, quantization, kv_cache_dtype: `record_stated`), recorded before rescoring.
    - `replay`: `out` is an imported/retokenized run; replay its tokens through vLLM (`model`, default the run's
      engine model, at `generate.temperature`) for rollout_logprob, then rescore.

    vLLM is shut down before the training model loads. Raises ConfigError for missing inputs, and for a trainer
    device that does not exist (`rescore.device`, auto: cuda when available), before any work. An existing run is
    opened (and checked at the door) once; each stage gets that Run and returns the manifest it wrote.
    """
    phases = phases or Phases(silent)
    out = Path(out)
    if rescore_only and replay:
        raise ConfigError("--rescore-only and --rescore-both exclude each other")
    if rescore is not None:  # a device that does not exist fails now, not after the engine's start and generation
        from rcdiag.score.devices import resolve_device

        rescore = replace(rescore, device=resolve_device(rescore.device))
    run: Run | None = None  # the run as opened once; generation writes a new one, which rescoring opens
    manifest: dict[str, Any] = {}  # what the last stage wrote: each stage returns it
    if rescore_only:
        if rescore is None:
            raise ConfigError("--rescore-only needs the rescoring stage (drop --generate-only)")
        run = open_run(out)
        if stated:
            record_stated(run, stated)
            run = run.reopen()  # rescoring reads the temperature it now records
    elif replay:
        run = open_run(out)
        manifest = _replay(run, model, generate, overwrite, silent, phases)
        run = run.reopen()  # the replay rewrote the rollout column and the engine section that rescoring reads
    else:
        missing = [flag for flag, value in (("--model", model), ("--prompts", prompts)) if value is None]
        if missing:
            raise ConfigError(f"{', '.join(missing)} required (or --rescore-only RUN to rescore an existing run)")
        # imported here, not at the top: `rcdiag score --help` stays light
        from rcdiag.score.generate import generate_run

        manifest = generate_run(model, prompts, out, generate, overwrite=overwrite, silent=silent, phases=phases)
    if rescore is not None:
        from rcdiag.score.rescore import rescore_run  # imports torch

        manifest = rescore_run(out if run is None else run, rescore, silent=silent, phases=phases)
    return ScoreResult(run=out, info=Manifest.of(manifest), seconds=dict(phases.seconds))


def _replay(run: Run, model: str | Path | None, config: GenerateConfig, overwrite: bool, silent: bool,
            phases: Phases) -> dict[str, Any]:
    from rcdiag.score.replay import replay_run

    engine_model = model or run.info.engine_model
    if engine_model is None:
        raise ConfigError(f"{run.path}: the manifest names no engine model; pass --model")
    return replay_run(run, engine_model, config, overwrite=overwrite, silent=silent, phases=phases)


STATED_BY = "rcdiag score --rescore-only --{}"


def record_stated(run: Run, stated: dict[str, Any]) -> dict[str, Any]:
    """Record what the user states about a run's engine (`--temperature`, `--engine-dtype`, `--quantization`,
    `--kv-cache-dtype` with --rescore-only): for an imported run the engine side is known only from them. A value
    the run already records otherwise — generated by rcdiag, or said by the dump or a recorder — is refused, naming
    both: a run never carries two answers. Returns the updated manifest."""
    engine = run.info.engine
    known = {} if engine is None else {"temperature": engine.temperature, "engine_dtype": engine.requested_dtype,
                                       "quantization": engine.quantization, "kv_cache_dtype": engine.kv_cache_dtype}
    for name, value in stated.items():
        if known.get(name) is not None and known[name] != value:
            provenance = run.info.provenance
            where = provenance.get(f"engine.{name}") or provenance.get("engine") or run.info.source.kind or "the run"
            raise ConfigError(f"--{name.replace('_', '-')} {value!r}: {run.path} records engine {name} "
                              f"{known[name]!r} ({where}); leave the option out")
    return update_manifest(run.path, {"engine": dict(stated), "provenance": {
        **run.info.provenance, **{f"engine.{name}": STATED_BY.format(name.replace("_", "-")) for name in stated}}})
