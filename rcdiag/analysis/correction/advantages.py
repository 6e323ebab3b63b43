"""Advantages for the sign-dependent gates (DPPO): from the data, from an argument, or GRPO's from rewards.

DPPO's mask depends on the sign of each token's advantage (verl `compute_policy_loss_dppo_tv`: A > 0 masks a
probability that rose too far, A ≤ 0 one that fell too far), so "what share would δ = 0.2 mask?" needs them.
Where they come from, first found wins (`resolve`; the result says which in `source`):

1. `advantages=` given: a frame/table with seq_id and advantage (one per sequence) or seq_id, pos, advantage
   (per token), a {seq_id: A} mapping, or "grpo" / "grpo_std" to force the derivation below;
2. an `advantage` column in the token rows (per token, as prime-rl's and NeMo-RL's dumps carry it);
3. an `advantage` column of the sequences table (per sequence; the importers and the recorder fill it);
4. GRPO from `reward` and `prompt_id` (grouped by step and prompt), as verl `compute_grpo_outcome_advantage`
   (@ 1dda039, verl/trainer/ppo/core_algos.py): A = r − mean of the group, or with std (norm_adv_by_std_in_grpo)
   (r − mean) / (std + 1e-6), std the unbiased one; a group of one has mean 0 and std 1.
Otherwise `source` is "none" and sign-dependent gates are refused.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from rcdiag.analysis.passes.chunks import TokenChunk
from rcdiag.errors import ConfigError, InputError

GRPO_EPS = 1e-6
"""verl's epsilon in (r − mean) / (std + eps)."""
SOURCES = ("argument", "tokens", "sequences", "grpo", "grpo_std", "none")


@dataclass
class Advantages:
    """Per-sequence (`seq_ids` sorted, `values`) or per-token (`token_seq`, `token_pos` sorted, `token_values`)
    advantages; `rows(chunk)` gives each row's (NaN where unknown)."""

    source: str
    seq_ids: np.ndarray | None = None
    values: np.ndarray | None = None
    token_seq: np.ndarray | None = None
    token_pos: np.ndarray | None = None
    token_values: np.ndarray | None = None

    @property
    def known(self) -> bool:
        return self.source != "none"

    def rows(self, chunk: TokenChunk) -> np.ndarray:
        if self.token_values is not None:
            return _lookup_tokens(self, chunk)
        if self.values is None or not self.seq_ids.size:
            return np.full(chunk.n, np.nan)
        at = np.minimum(np.searchsorted(self.seq_ids, chunk.seq_ids), self.seq_ids.size - 1)
        per_seq = np.where(self.seq_ids[at] == chunk.seq_ids, self.values[at], np.nan)
        return chunk.per_row(per_seq)


def _lookup_tokens(adv: Advantages, chunk: TokenChunk) -> np.ndarray:
    keys = adv.token_seq.astype(np.int64) * (1 << 31) + adv.token_pos.astype(np.int64)
    wanted = chunk.per_row(chunk.seq_ids) * (1 << 31) + chunk.pos.astype(np.int64)
    at = np.minimum(np.searchsorted(keys, wanted), max(keys.size - 1, 0))
    if not keys.size:
        return np.full(chunk.n, np.nan)
    return np.where(keys[at] == wanted, adv.token_values[at], np.nan)


def _from_table(table: pa.Table, source: str, origin: str) -> Advantages:
    """Advantages from a table with seq_id, advantage (+ pos: per token); nulls/non-finite refused."""
    for name in ("seq_id", "advantage"):
        if name not in table.column_names:
            raise InputError(f"advantages need a {name!r} column (have: {', '.join(table.column_names)})",
                             file=origin, field=name)
    values = table.column("advantage")
    if not (pa.types.is_floating(values.type) or pa.types.is_integer(values.type)):
        raise InputError(f"advantage must be numeric, got {values.type}", file=origin, field="advantage")
    adv = np.asarray(values.cast(pa.float64()).fill_null(np.nan), dtype=np.float64)
    bad = np.flatnonzero(~np.isfinite(adv))
    if bad.size:
        raise InputError("advantage is null or not finite", file=origin, row=int(bad[0]) + 1, field="advantage")
    seq = np.asarray(table.column("seq_id"), dtype=np.int64)
    if "pos" in table.column_names:
        pos = np.asarray(table.column("pos"), dtype=np.int64)
        order = np.lexsort((pos, seq))
        return Advantages(source, token_seq=seq[order], token_pos=pos[order], token_values=adv[order])
    order = np.argsort(seq, kind="stable")
    seq, adv = seq[order], adv[order]
    if seq.size > 1 and (np.diff(seq) == 0).any():
        dup = int(seq[np.flatnonzero(np.diff(seq) == 0)[0]])
        raise InputError(f"seq_id {dup} has two advantages", file=origin, field="advantage")
    return Advantages(source, seq_ids=seq, values=adv)


def grpo(seq_ids: np.ndarray, rewards: np.ndarray, prompts: np.ndarray, steps: np.ndarray,
         normalize_std: bool) -> Advantages:
    """GRPO advantages per sequence (module docstring, item 4)."""
    keys = np.array([f"{s}\x00{p}" for s, p in zip(steps.tolist(), prompts.tolist(), strict=True)], dtype=object)
    _, group = np.unique(keys, return_inverse=True)
    group = group.reshape(-1)
    size = np.bincount(group).astype(np.float64)
    total = np.bincount(group, weights=rewards)
    mean = np.where(size > 1, total / size, 0.0)
    dev = rewards - mean[group]
    sq = np.bincount(group, weights=dev * dev)
    std = np.where(size > 1, np.sqrt(sq / np.maximum(size - 1, 1)), 1.0)
    values = dev / (std[group] + GRPO_EPS) if normalize_std else dev
    order = np.argsort(seq_ids, kind="stable")
    return Advantages("grpo_std" if normalize_std else "grpo", seq_ids=seq_ids[order], values=values[order])


def _sequence_columns(data: Any, sequences: Any) -> pa.Table | None:
    from rcdiag.store.run import Run
    from rcdiag.store.schema import as_table

    if sequences is not None:
        return as_table(sequences, source="sequences")
    if isinstance(data, Run):
        have: set[str] = set()
        for file in data.sequence_files:
            have |= set(pq.read_schema(file).names)
        wanted = [c for c in ("seq_id", "advantage", "reward", "prompt_id", "step") if c in have or c == "seq_id"]
        return data.sequence_table(wanted)
    return None


def token_advantages(run: Any) -> bool:
    """Whether every token file of `run` (a store Run) has an advantage column: then the advantages are the token
    rows' own (resolve's first source), and a file's rows carry theirs."""
    return bool(run.token_files) and all("advantage" in pq.read_schema(f).names for f in run.token_files)


def _token_column(data: Any) -> pa.Table | None:
    """seq_id, pos, advantage of the token rows when they carry an advantage column (else None)."""
    from rcdiag.store.run import Run
    from rcdiag.store.schema import as_table

    if isinstance(data, Run):
        if not token_advantages(data):
            return None
        return pa.concat_tables([pq.read_table(f, columns=["seq_id", "pos", "advantage"]) for f in data.token_files])
    try:
        table = as_table(data, source="tokens")
    except InputError:
        return None
    if "advantage" not in table.column_names:
        return None
    table = table.select(["seq_id", "pos", "advantage"])
    mask = table.column("advantage").is_valid()
    return table.filter(mask) if table.num_rows else table


def resolve(data: Any, sequences: Any = None, advantages: Any = None, normalize_std: bool = False) -> Advantages:
    """The advantages of `data` (module docstring for the order)."""
    import pandas as pd

    from rcdiag.store.schema import as_table

    if isinstance(advantages, str):
        if advantages not in ("grpo", "grpo_std", "none"):
            raise ConfigError(f"advantages={advantages!r}: give a frame with seq_id and advantage, or 'grpo', "
                              "'grpo_std' or 'none'")
        if advantages == "none":
            return Advantages("none")
        return _grpo_or_refuse(data, sequences, advantages == "grpo_std", forced=True)
    if advantages is not None:
        if isinstance(advantages, dict):
            advantages = pd.DataFrame({"seq_id": list(advantages), "advantage": list(advantages.values())})
        elif isinstance(advantages, pd.Series):
            advantages = pd.DataFrame({"seq_id": advantages.index.to_numpy(), "advantage": advantages.to_numpy()})
        return _from_table(as_table(advantages, source="advantages"), "argument", "advantages")
    tokens = _token_column(data)
    if tokens is not None and tokens.num_rows:
        return _from_table(tokens, "tokens", "tokens")
    return _from_sequences(_sequence_columns(data, sequences), normalize_std)


def _from_sequences(table: pa.Table | None, normalize_std: bool) -> Advantages:
    """resolve's sequence-level sources, from the sequence columns read once: their advantage column when it is
    complete, else GRPO's from reward + prompt_id, else none."""
    if table is not None and "advantage" in table.column_names and table.column("advantage").null_count == 0 \
            and table.num_rows:
        return _from_table(table.select(["seq_id", "advantage"]), "sequences", "sequences")
    return _grpo_or_refuse(None, table, normalize_std, forced=False)


def run_advantages(run: Any) -> tuple[Advantages, Advantages] | None:
    """The whole run's per-sequence (advantages, rewards) for a pass whose file tasks each read one shard: a GRPO
    prompt group may span shards, so its advantages (r − the group's mean) are formed over the run, never within a
    file; the sequence columns are read once for both. None when the token rows carry their own advantages (each
    file's are complete)."""
    if token_advantages(run):
        return None
    table = _sequence_columns(run, None)
    return _from_sequences(table, False), sequence_rewards(run, table)


def _grpo_or_refuse(data: Any, sequences: Any, normalize_std: bool, forced: bool) -> Advantages:
    table = _sequence_columns(data, sequences)
    usable = table is not None and all(c in table.column_names for c in ("reward", "prompt_id")) and \
        table.num_rows and table.column("reward").null_count == 0 and table.column("prompt_id").null_count == 0
    if not usable:
        if forced:
            raise ConfigError("GRPO advantages need a reward and a prompt_id for every sequence (the sequences "
                              "table, or sequences=)")
        return Advantages("none")
    steps = (np.asarray(table.column("step").fill_null(-1), dtype=np.int64) if "step" in table.column_names
             else np.zeros(table.num_rows, np.int64))
    return grpo(np.asarray(table.column("seq_id"), dtype=np.int64),
                np.asarray(table.column("reward").cast(pa.float64()), dtype=np.float64),
                np.asarray(table.column("prompt_id").cast(pa.string()).to_pylist(), dtype=object), steps,
                normalize_std)


def sequence_rewards(data: Any, sequences: Any = None) -> Advantages:
    """The rewards per sequence in the same lookup shape (NeMo-RL's masked_correct_pct counts masked sequences
    with reward 1); source "none" when the sequences carry no reward."""
    table = _sequence_columns(data, sequences)
    if table is None or "reward" not in table.column_names or table.column("reward").null_count == table.num_rows:
        return Advantages("none")
    seq = np.asarray(table.column("seq_id"), dtype=np.int64)
    values = np.asarray(table.column("reward").cast(pa.float64()).fill_null(np.nan), dtype=np.float64)
    order = np.argsort(seq, kind="stable")
    return Advantages("sequences", seq_ids=seq[order], values=values[order])
