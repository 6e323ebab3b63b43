"""`rcdiag.Recorder`: a trainer writes both sides' log-probs into an rcdiag run directory while it trains.

    rec = rcdiag.Recorder("runs/live", every=10)
    rec.add(step, prompt_ids, response_ids, rollout_logprobs, train_logprobs, mask, version=…, reward=…)

Each recorded step becomes one shard of the run (tokens, then sequences — the shard's commit marker — each written
under a temporary name and renamed), and the manifest is rewritten after it, so the run opens, reports and shows
in the dashboard at any moment of training, with one row per step in "Across training". Re-opening the same path
(a restarted job) keeps the complete shards, drops a shard whose write was cut off, and skips steps already
recorded, so a resumed trainer does not double them. Cost: nothing on the steps between `every`, and on a
recorded step one host copy of the fields plus one Parquet write of at most `max_samples` samples
(benchmarks/bench_recorder.py measures it against the step's own tensor work).
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq

from rcdiag.errors import ConfigError
from rcdiag.importers.common import (
    Record,
    check_lengths,
    check_token_ids,
    sequence_table,
    settle_versions,
    token_table,
)
from rcdiag.importers.values import number, token_id_list, whole_number
from rcdiag.importers.vocab import attach_tokenizer
from rcdiag.record.batch import TensorLike, per_sample, per_value, to_numpy
from rcdiag.store.files import MANIFEST_NAME, PENDING_NAME, SEQUENCES_DIR, TOKENS_DIR, now
from rcdiag.store.manifest import new_manifest, write_manifest
from rcdiag.store.writer import RunWriter, prepare_sequences, prepare_tokens

SPEC = {"writer": "rcdiag.Recorder", "layout": 1}
"""The RunWriter spec of a recorded run: the same for every Recorder, so a restart with other options resumes."""


@dataclass
class Batch:
    """The arguments of one `Recorder.add` call, as given (tensors, arrays, lists or scalars)."""

    prompt_ids: Any
    response_ids: Any
    rollout_logprobs: Any
    train_logprobs: Any
    mask: Any
    lengths: Any
    prompt_mask: Any
    version: Any
    version_min: Any
    trainer_version: Any
    reward: Any
    advantage: Any
    entropy: Any
    prompt_id: Any


@dataclass
class RecorderOptions:
    """What a Recorder does (each default lives here)."""

    every: int = 1
    max_samples: int | None = None
    version_is_step: bool = True
    trainer_policy: str = "pi_old"
    tokenizer: str | None = None
    sections: dict[str, Any] = field(default_factory=dict)


class Recorder:
    """Writes a run directory step by step (module docstring). `every`: record steps divisible by it;
    `max_samples`: record at most this many samples of a step (the first ones); `version_is_step`: a sample's
    `version` is counted in the trainer's steps, so the trainer's own version is the step (pass
    `trainer_version=` to `add` otherwise); `trainer_policy`: what `train_logprobs` are ("pi_old", or
    "pi_theta_microstep" when they come from inside the update); `tokenizer`: the policy's tokenizer directory
    (recorded, so reports show token text); `sections`: manifest sections to keep (e.g. {"engine": {"name":
    "vllm", "version": …, "temperature": 1.0}, "trainer": {"dtype": "bfloat16"}})."""

    def __init__(self, path: str | os.PathLike, every: int = 1, **options: Any) -> None:
        self.options = RecorderOptions(every=every, **options)
        if not isinstance(every, int) or isinstance(every, bool) or every < 1:
            raise ConfigError(f"every={every!r}: record every K-th step, K a whole number ≥ 1")
        self.path = Path(path)
        self.writer = RunWriter(self.path, SPEC)
        self._drop_cut_shards()
        self._steps: set[int] = set()
        self._next_seq = 0
        self._counts = {"sequences": 0, "tokens": 0, "shards": 0}
        self._read_existing()
        self._tokenizer: dict[str, Any] | None = None
        self._created = now()

    # ------------------------------------------------------------------------------------------------ resume
    def _drop_cut_shards(self) -> None:
        """A token file without its sequences file is a shard whose write was cut off: removed."""
        done = {f.name for f in (self.path / SEQUENCES_DIR).glob("part-*.parquet")}
        for file in (self.path / TOKENS_DIR).glob("part-*.parquet"):
            if file.name not in done:
                file.unlink()

    def _read_existing(self) -> None:
        for file in sorted((self.path / SEQUENCES_DIR).glob("part-*.parquet")):
            table = pq.read_table(file, columns=["seq_id", "step"])
            steps = table.column("step").drop_null().to_pylist()
            self._steps.update(int(s) for s in steps)
            if table.num_rows:
                self._next_seq = max(self._next_seq, int(max(table.column("seq_id").to_pylist())) + 1)
            self._counts["sequences"] += table.num_rows
            self._counts["tokens"] += pq.ParquetFile(self.path / TOKENS_DIR / file.name).metadata.num_rows
            self._counts["shards"] += 1

    # ------------------------------------------------------------------------------------------------ writing
    def due(self, step: int) -> bool:
        """Whether `add(step, …)` would record: a step divisible by `every`, not recorded before."""
        return step % self.options.every == 0 and step not in self._steps

    @property
    def steps(self) -> list[int]:
        """The steps recorded so far (this session and before it)."""
        return sorted(self._steps)

    def add(self, step: int, prompt_ids: Any, response_ids: Any, rollout_logprobs: Any = None,
            train_logprobs: Any = None, mask: Any = None, *, lengths: Any = None, prompt_mask: Any = None,
            version: Any = None, version_min: Any = None, trainer_version: Any = None, reward: Any = None,
            advantage: Any = None, entropy: Any = None, prompt_id: Any = None) -> bool:
        """Record one step's batch; True when written, False when the step is not due (`due`).

        `response_ids` [B, T] (right-padded) or B sequences; the per-token fields (`rollout_logprobs`,
        `train_logprobs`, `mask` (0 = out of the loss), `entropy`, a per-token `advantage` or `version`) the same
        shape; `lengths` [B]: the true response lengths of a padded batch (else the padding is found by `mask`:
        everything after the last 1). `prompt_ids` [B, P] (left-padded, with `prompt_mask`) or B sequences, or
        None. `version` (the weights that generated the sample), `version_min` (the oldest, for a sample continued
        across a weight update), `trainer_version` (the weights of `train_logprobs`), `reward`, `advantage`,
        `prompt_id`: one value for the batch, B values, or (version, advantage) [B, T] per token. Tensors may live
        on any device.
        """
        step = whole_number(step, ("Recorder.add", None), "step")
        if not self.due(step):
            return False
        batch = Batch(prompt_ids, response_ids, rollout_logprobs, train_logprobs, mask, lengths, prompt_mask,
                      version, version_min, trainer_version, reward, advantage, entropy, prompt_id)
        self._write(step, self._records(step, batch))
        return True

    def _records(self, step: int, batch: Batch) -> list[Record]:
        """The batch's first `max_samples` samples as Records, cut to their true lengths and checked."""
        ids = per_sample(batch.response_ids, None, "response_ids")
        padded = isinstance(batch.response_ids, TensorLike | np.ndarray)
        n = len(ids)
        if batch.rollout_logprobs is None and batch.train_logprobs is None:
            raise ConfigError("Recorder.add needs rollout_logprobs and/or train_logprobs")
        tokens = {name: per_sample(getattr(batch, attr), n, attr) for name, attr in (
            ("rollout_logprobs", "rollout_logprobs"), ("train_logprobs", "train_logprobs"), ("mask", "mask"),
            ("train_entropy", "entropy"), ("token_versions", "version"), ("token_advantages", "advantage"))
            if name in ("rollout_logprobs", "train_logprobs", "mask", "train_entropy")
            or _is_per_token(getattr(batch, attr))}
        prompts = per_sample(batch.prompt_ids, n, "prompt_ids")
        prompt_masks = per_sample(batch.prompt_mask, n, "prompt_mask")
        lengths = per_value(batch.lengths, n, "lengths")
        given = {attr: getattr(batch, attr) for attr in ("version", "version_min", "trainer_version", "reward",
                                                          "advantage", "prompt_id")}
        given["version"] = None if "token_versions" in tokens else given["version"]
        given["advantage"] = None if "token_advantages" in tokens else given["advantage"]
        scalars = {attr: per_value(value, n, attr) for attr, value in given.items()}
        out = [self._record(step, i, ids[i], tokens, prompts, prompt_masks, lengths[i], scalars, padded)
               for i in range(n if self.options.max_samples is None else min(n, self.options.max_samples))]
        check_lengths(out, {"rollout_logprobs": "rollout_logprobs", "train_logprobs": "train_logprobs",
                            "mask": "mask", "train_entropy": "entropy", "token_versions": "version",
                            "token_advantages": "advantage"})
        for record in out:
            settle_versions(record)
        check_token_ids(out)
        return out

    def _record(self, step: int, i: int, ids: np.ndarray, tokens: dict[str, Any], prompts: Any, prompt_masks: Any,
                length: Any, scalars: dict[str, list[Any]], padded: bool) -> Record:
        where = (f"Recorder.add(step={step})", i + 1)
        end = _length(ids, None if tokens["mask"] is None else tokens["mask"][i], length, padded)
        cut = {name: None if rows is None else rows[i][:end].astype(np.float64) for name, rows in tokens.items()}
        prompt = None if prompts is None else prompts[i]
        if prompt is not None and prompt_masks is not None:
            prompt = prompt[prompt_masks[i] != 0]
        policy = whole_number(scalars["version"][i], where, "version")
        trainer = whole_number(scalars["trainer_version"][i], where, "trainer_version")
        if trainer is None and self.options.version_is_step and (policy is not None or "token_versions" in cut):
            trainer = step
        prompt_id = scalars["prompt_id"][i]
        return Record(
            where=where, step=step, response_ids=token_id_list(ids[:end], where, "response_ids"),
            prompt_ids=None if prompt is None else token_id_list(prompt, where, "prompt_ids"),
            policy_version=policy, policy_version_min=whole_number(scalars["version_min"][i], where, "version_min"),
            trainer_version=trainer, advantage=number(scalars["advantage"][i], where, "advantage"),
            reward=number(scalars["reward"][i], where, "reward"), sample_index=i,
            prompt_id=None if prompt_id is None else str(prompt_id),
            **{name: cut.get(name) for name in ("rollout_logprobs", "train_logprobs", "mask", "train_entropy",
                                                "token_versions", "token_advantages")})

    def _write(self, step: int, records: list[Record]) -> None:
        if self.options.tokenizer and self._tokenizer is None:
            self._tokenizer = attach_tokenizer(self.options.tokenizer, records)
        source = f"recorded step {step}"
        tokens = prepare_tokens(token_table(records, self._next_seq), source=source)
        sequences = prepare_sequences(sequence_table(records, self._next_seq), tokens, source=source)
        index = max(self.writer.complete_shards(), default=-1) + 1
        self.writer.write_shard(index, tokens, sequences)
        self._steps.add(step)
        self._next_seq += len(records)
        self._counts = {"sequences": self._counts["sequences"] + sequences.num_rows,
                        "tokens": self._counts["tokens"] + tokens.num_rows, "shards": self._counts["shards"] + 1}
        self._finish()

    def _finish(self) -> None:
        """The manifest, rewritten after every recorded step (so the run is complete at every moment)."""
        base = {**new_manifest("recorded"), "created": self._created}
        measured = {"rollout": "sampled", "trainer": self.options.trainer_policy}
        manifest = {**base, **self.options.sections, "measured": measured, "spec": SPEC, "counts": self._counts,
                    "recorded": {"every": self.options.every, "max_samples": self.options.max_samples,
                                 "steps": len(self._steps), "updated": now()}}
        if self._tokenizer is not None:
            manifest["tokenizer"] = self._tokenizer
        write_manifest(self.path, manifest)
        (self.path / PENDING_NAME).unlink(missing_ok=True)

    def close(self) -> None:
        """Nothing is buffered (each step is complete on disk when `add` returns); kept for `with` blocks."""

    def __enter__(self) -> Recorder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "complete" if (self.path / MANIFEST_NAME).exists() else "empty"
        return f"Recorder({str(self.path)!r}, every={self.options.every}, steps={len(self._steps)}, {state})"


def _is_per_token(value: Any) -> bool:
    """A [B, T] tensor/array or a list of lists (vs one value per sample)."""
    if value is None or isinstance(value, int | float | str):
        return False
    array = to_numpy(value) if not isinstance(value, list) else None
    if array is not None:
        return array.ndim == 2
    return bool(value) and not isinstance(value[0], int | float | str | np.generic)


def _length(ids: np.ndarray, mask: np.ndarray | None, given: Any, padded: bool) -> int:
    """The true response length: given, else (a row of a padded tensor) up to the last mask-1 position, else every
    id (a list holds each sample as it is)."""
    if given is not None:
        return min(int(given), ids.size)
    if padded and mask is not None and mask.size == ids.size:
        ones = np.flatnonzero(mask != 0)
        return int(ones[-1]) + 1 if ones.size else 0
    return ids.size
