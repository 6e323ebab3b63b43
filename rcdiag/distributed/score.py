"""`rcdiag score --ray`: generation and rescoring as one Ray Data pipeline over prompt shards.

One row per shard k (prompts k·S … k·S+S−1, as the local path): `map_batches` with an actor pool of vLLM
engines (one per GPU, or per worker on CPU) generates it with the same per-request seeds (rcdiag.score.generate),
then an actor pool of training models rescores it (rcdiag.score.scoring) and writes the finished shard (tokens, then
sequences, each atomically) into the run directory — a local path or a pyarrow filesystem URI. The driver only
plans shards and writes the manifest last. A rerun skips complete shards; a killed actor is restarted by Ray
Data and its shard retried, and since a shard is written whole under its fixed name nothing is lost or doubled.
"""
from __future__ import annotations

import json
import math
import os
import pickle
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import pyarrow as pa

from rcdiag.distributed.store import ShardSink, open_writer
from rcdiag.errors import ConfigError
from rcdiag.progress import progress
from rcdiag.score.config import GenerateConfig, RescoreConfig
from rcdiag.score.engine import ENV_DEFAULTS, check_model_dir, model_context_length, model_files_hash
from rcdiag.score.prompts import load_prompts, render_prompts
from rcdiag.score.spec import generate_manifest, reward_function, run_spec, tokenizer_section
from rcdiag.score.tokenizer_check import check_vocabulary
from rcdiag.tokenizers import load_tokenizer

ENV_FORWARDED = (*ENV_DEFAULTS, "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "VLLM_LOGGING_LEVEL", "OMP_NUM_THREADS")
"""Environment variables the driver forwards to the actors (runtime_env), so a remote cluster behaves alike."""


SUMMARY_COLUMNS = ("shard", "tokens", "sequences", "facts", "trainer", "generate_s", "rescore_s")
"""One row per written shard, as the driver receives it (response tokens, busy seconds of each stage)."""
DEFAULT_ENGINES_PER_RESCORER = 8
"""Rescoring (one forward pass) is ~10× faster per GPU than sampling: by default one rescorer per 8 engines."""


def _ipc(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


def _from_ipc(data: bytes) -> pa.Table:
    return pa.ipc.open_stream(pa.py_buffer(data)).read_all()


class EngineActor:
    """One vLLM engine; turns a batch of shard rows (shard, prompts) into (shard, tokens, sequences, facts)."""

    def __init__(self, model_dir: str, config: GenerateConfig):
        from rcdiag.score.engine import build_engine, engine_facts

        self.config = config
        self.llm = build_engine(config.engine_settings(model_dir))
        self.facts = json.dumps(engine_facts(self.llm), default=str)

    def __call__(self, batch: dict[str, Any]) -> dict[str, list[Any]]:
        from rcdiag.score.generate import run_requests, shard_tables  # vLLM: only inside the actor

        out: dict[str, list[Any]] = {"shard": [], "tokens": [], "sequences": [], "facts": [], "generate_s": []}
        for shard, blob in zip(batch["shard"], batch["prompts"], strict=True):
            chunk = pickle.loads(blob)
            start = time.perf_counter()
            results = run_requests(self.llm, chunk, self.config)
            seconds = time.perf_counter() - start
            tokens, sequences = shard_tables(chunk, results, self.config.n, reward_function(chunk))
            for key, value in (("shard", int(shard)), ("tokens", _ipc(tokens)), ("sequences", _ipc(sequences)),
                               ("facts", self.facts), ("generate_s", seconds)):
                out[key].append(value)
        return out


class RescoreActor:
    """One training model; rescores generated shards and writes each finished shard into the run directory."""

    def __init__(self, out: str, config: Any, temperature: float, epilogue_tokens: int):
        from rcdiag.score.logprobs import choose_epilogue
        from rcdiag.score.rescore import trainer_settings
        from rcdiag.score.scoring import load_model, model_limits

        self.sink, self.config, self.temperature = ShardSink(out), config, temperature
        self.model = load_model(config.train_model, dtype=config.train_dtype, device=config.device,
                                attn=config.attn, trust_remote_code=config.trust_remote_code)
        self.limits = model_limits(self.model.config)
        name, self.epilogue = choose_epilogue(epilogue_tokens, self.limits[0], config.device)
        self.settings = trainer_settings(config.train_model, self.model, config, temperature, name)

    def __call__(self, batch: dict[str, Any]) -> dict[str, list[Any]]:
        out: dict[str, list[Any]] = {name: [] for name in SUMMARY_COLUMNS}
        for shard, tok_blob, seq_blob, facts, generate_s in zip(
                batch["shard"], batch["tokens"], batch["sequences"], batch["facts"], batch["generate_s"], strict=True):
            start = time.perf_counter()
            tokens, sequences = self._score(int(shard), _from_ipc(tok_blob), _from_ipc(seq_blob))
            seconds = time.perf_counter() - start
            self.sink.write(int(shard), tokens, sequences)
            for key, value in (("shard", int(shard)), ("tokens", tokens.num_rows),
                               ("sequences", sequences.num_rows), ("facts", facts),
                               ("trainer", json.dumps(self.settings, default=str)), ("generate_s", generate_s),
                               ("rescore_s", seconds)):
                out[key].append(value)
        return out

    def _score(self, shard: int, tokens: pa.Table, sequences: pa.Table) -> tuple[pa.Table, pa.Table]:
        from rcdiag.score.rescore import RESCORED_KEY, shard_pairs
        from rcdiag.score.scoring import score_sequences
        from rcdiag.store.files import shard_name

        name = shard_name(shard)
        pairs = shard_pairs(tokens, sequences, source=f"tokens/{name}", vocab_size=self.limits[0],
                            max_context=self.limits[1])
        scored = score_sequences(self.model, pairs, temperature=self.temperature,
                                 token_budget=self.config.token_budget, chunk_tokens=self.config.chunk_tokens,
                                 epilogue=self.epilogue, source=f"sequences/{name}")
        for column, values in (("train_logprob", scored.logprobs), ("train_entropy", scored.entropies)):
            index = tokens.schema.get_field_index(column)
            tokens = tokens.set_column(index, pa.field(column, pa.float32()), pa.array(values, type=pa.float32()))
        marker = {**(tokens.schema.metadata or {}), RESCORED_KEY: json.dumps(self.settings, sort_keys=True).encode()}
        return tokens.replace_schema_metadata(marker), sequences


def actor_resources(ray: Any, pools: int) -> dict[str, float]:
    """Per-actor resources: one GPU each when the cluster has GPUs, else an equal share of its CPUs."""
    total = ray.cluster_resources()
    if total.get("GPU", 0) >= 1:
        return {"num_gpus": 1}
    return {"num_cpus": max(0.01, math.floor(100 * float(total.get("CPU", 1)) / pools) / 100)}


def _runtime_env() -> dict[str, Any]:
    env = {**ENV_DEFAULTS, **{k: os.environ[k] for k in ENV_FORWARDED if k in os.environ}}
    return {"env_vars": env}


def _plan(model: str | Path, prompts: str | Path, config: GenerateConfig, rescore: Any
          ) -> tuple[Path, list[Any], dict[str, Any], Any]:
    """(model dir, rendered prompts, run spec, rescore config with train_model set); refusals happen here."""
    from rcdiag.score.scoring import load_config  # torch: only when a run is planned

    model_dir = check_model_dir(model)
    tokenizer = load_tokenizer(model_dir, trust_remote_code=config.trust_remote_code, what="--model")
    loaded = load_prompts(prompts, prompt_field=config.prompt_field, limit=config.limit)
    rendered = render_prompts(loaded, tokenizer, source=str(prompts), max_len=model_context_length(model_dir, config.max_model_len))
    rescore = replace(rescore, train_model=str(rescore.train_model or model_dir))
    check_vocabulary({"tokenizer": tokenizer_section(model_dir)}, str(model_dir), rescore.train_model,
                     load_config(rescore.train_model, trust_remote_code=rescore.trust_remote_code))
    spec = run_spec(config, model_dir, model_files_hash(model_dir), rendered)
    spec["stage"] = "generate+rescore (ray)"
    spec["trainer"] = {k: v for k, v in asdict(rescore).items() if k != "trust_remote_code"}
    return model_dir, rendered, spec, rescore


def score_on_ray(model: str | Path, prompts: str | Path, out: str, config: GenerateConfig | None = None,
                 rescore: Any = None, *, ray_address: str = "auto", engines: int = 1, rescorers: int | None = None,
                 overwrite: bool = False, silent: bool = False, engine_class: type = EngineActor
                 ) -> dict[str, Any]:
    """Generate and rescore (or resume) a run at `out` on a Ray cluster; returns its manifest.

    `engines` vLLM actors and `rescorers` (default: one per DEFAULT_ENGINES_PER_RESCORER engines, at least one)
    training-model actors run at once, each with a GPU when the cluster has them. `engine_class` exists for tests (e.g. a subclass that lets a test kill it).
    """
    from rcdiag.distributed import ray_session

    config = config or GenerateConfig()
    if engines < 1 or (rescorers is not None and rescorers < 1):
        raise ConfigError(f"--engines must be ≥ 1, got {engines}")
    model_dir, rendered, spec, rescore = _plan(model, prompts, config, rescore or RescoreConfig())
    writer = open_writer(str(out), spec, overwrite=overwrite)
    size = config.shard_prompts
    done = set(writer.complete_shards())
    todo = [k for k in range(math.ceil(len(rendered) / size)) if k not in done]
    with ray_session(ray_address) as ray:
        rescorers = rescorers or math.ceil(engines / DEFAULT_ENGINES_PER_RESCORER)
        rows = _pipeline(ray, model_dir, rendered, todo, out, config, rescore, engines, rescorers,
                         engine_class, silent)
    return _finish(writer, config, model_dir, prompts, rendered, rows, str(out))


def _pipeline(ray: Any, model_dir: Path, rendered: list[Any], todo: list[int], out: str, config: GenerateConfig,
              rescore: Any, engines: int, rescorers: int, engine_class: type, silent: bool) -> list[dict]:
    """Run the two actor pools over the shards in `todo`; returns one summary row per written shard."""
    if not todo:
        return []
    size = config.shard_prompts
    items = [{"shard": k, "prompts": pickle.dumps(rendered[k * size:(k + 1) * size])} for k in todo]
    resources = actor_resources(ray, engines + rescorers)
    env = _runtime_env()
    dataset = ray.data.from_items(items, override_num_blocks=len(items))
    generated = dataset.map_batches(engine_class, batch_size=1, compute=ray.data.ActorPoolStrategy(size=engines),
                                    runtime_env=env,
                                    fn_constructor_kwargs={"model_dir": str(model_dir), "config": config},
                                    **resources)
    expected = len(rendered) * config.n * config.max_tokens
    scored = generated.map_batches(RescoreActor, batch_size=1, compute=ray.data.ActorPoolStrategy(size=rescorers),
                                   runtime_env=env,
                                   fn_constructor_kwargs={"out": str(out), "config": rescore,
                                                          "temperature": config.temperature,
                                                          "epilogue_tokens": expected}, **resources)
    rows = []
    with progress(total=len(todo), desc="score (ray)", unit="shard", silent=silent) as bar:
        for row in scored.iter_rows():
            rows.append(row)
            bar.update(1)
            bar.set_postfix_str(f"{sum(r['tokens'] for r in rows)} tok")
    return rows


def _finish(writer: Any, config: GenerateConfig, model_dir: Path, prompts: str | Path, rendered: list[Any],
            rows: list[dict], out: str) -> dict[str, Any]:
    """Write the manifest last: the local path's sections, plus the trainer section and the cluster's shape."""
    first = rows[0] if rows else _recorded(out)
    facts, trainer = json.loads(first["facts"]), json.loads(first["trainer"])
    manifest = generate_manifest(config, model_dir, model_files_hash(model_dir), Path(prompts), rendered, facts,
                                 tokenizer_section(model_dir), reward_function(rendered) is not None)
    manifest["trainer"] = trainer
    manifest["distributed"] = {"backend": "ray", "shards_this_run": sorted(int(r["shard"]) for r in rows),
                               **throughput(rows)}
    return writer.finish(manifest)


def _recorded(out: str) -> dict[str, str]:
    """Engine facts and trainer settings of a run whose shards are all written but whose manifest is not."""
    import pyarrow.parquet as pq

    from rcdiag.distributed.store import filesystem
    from rcdiag.score.rescore import RESCORED_KEY
    from rcdiag.store.files import TOKENS_DIR, shard_name

    fs, base = filesystem(out)
    metadata = pq.read_schema(f"{base}/{TOKENS_DIR}/{shard_name(0)}", filesystem=fs).metadata or {}
    return {"facts": json.dumps({}), "trainer": metadata.get(RESCORED_KEY, b"{}").decode()}


def score_command(model: Path, prompts: Path, out: Any, config: GenerateConfig, rescore: Any, ray_address: str,
                  actors: tuple[int, int | None], overwrite: bool, quiet: bool, generate_only: bool) -> str:
    """`rcdiag score --ray`: run the pipeline and return the one-line summary the CLI prints. `actors`:
    (engines, rescorers or None for the default)."""
    from rcdiag.distributed.store import normalize_out

    if generate_only:
        raise ConfigError("--ray runs generation and rescoring as one pipeline; drop --generate-only (or --ray)")
    target = normalize_out(str(out))
    engines, rescorers = actors
    manifest = score_on_ray(model, prompts, target, config, rescore, ray_address=ray_address, engines=engines,
                            rescorers=rescorers, overwrite=overwrite, silent=quiet)
    counts = manifest["counts"]
    return (f"{target}: {counts['sequences']} sequences, {counts['tokens']} tokens in {counts['shards']} shard(s) "
            f"(generated + rescored on Ray, {engines} engine(s))")


def throughput(rows: list[dict]) -> dict[str, float | None]:
    """Response tokens per busy second of one engine and of one rescorer, over the shards of this invocation
    (None when nothing ran): the figures to size a cluster with (docs/scaling.md)."""
    tokens = sum(int(r["tokens"]) for r in rows)
    result: dict[str, float | None] = {}
    for stage in ("generate", "rescore"):
        seconds = sum(float(r[f"{stage}_s"]) for r in rows)
        result[f"{stage}_tokens_per_s_per_actor"] = round(tokens / seconds, 1) if seconds > 0 else None
    return result
