"""The weights-unchanged check: one side's log-probs bit-identical across versions that should differ.

A token's log-prob is a function of its context (prompt + response so far) and the weights. When the same
context and token come back at two different versions (a prompt repeated across steps or epochs: the same
prompt and response prefix), the log-probs must differ in their low bits as soon as the weights changed. If
every such pair is bit-identical, that side's weights did not change: a weight sync that silently failed, a prefix
cache reused across refits, or — martingale's first-run finding — an fp32 trainer whose Adam steps are below a bf16
engine's resolution, so the engine never moves. Versions: the engine side's are the sequences' `policy_version`
(else the step); the trainer side's are `trainer_version` (else the step).

Contexts are matched by a 64-bit polynomial hash of the prompt ids and the response prefix (token included),
computed with numpy over all tokens at once.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

MIN_PAIRS = 16
"""Fewest cross-version pairs of one side before it is judged (fewer: not testable on this run)."""
IDENTICAL_SHARE = 0.99
"""A side whose cross-version pairs are at least this share bit-identical has unchanged weights."""
_P = np.uint64(0x100000001B3)


@dataclass
class Unchanged:
    """One side's result: pairs of equal contexts at different versions compared, how many were bit-identical,
    an example pair of versions, and whether the check fires."""

    side: str
    pairs: int
    identical: int
    versions: tuple[int, int] | None

    @property
    def fires(self) -> bool:
        return self.pairs >= MIN_PAIRS and self.identical >= IDENTICAL_SHARE * self.pairs

    def message(self) -> str:
        example = "" if self.versions is None else f" (e.g. versions {self.versions[0]} and {self.versions[1]})"
        if self.pairs < MIN_PAIRS:
            return (f"{self.side}: {self.pairs} repeated context(s) across versions — too few to test whether the "
                    "weights changed")
        if self.fires:
            return (f"{self.side} log-probs are bit-identical across versions that should differ: {self.identical} "
                    f"of {self.pairs} repeated contexts{example}: the {self.side}'s weights did not change")
        return f"{self.side}: {self.pairs - self.identical} of {self.pairs} repeated contexts differ across versions"


def context_keys(seq_id: np.ndarray, pos: np.ndarray, token_id: np.ndarray,
                 prompt_hash: dict[int, int]) -> np.ndarray:
    """uint64 key per token row: hash(prompt) folded with the response prefix up to and including the token.
    Rows sorted by (seq_id, pos), positions 0..R-1 per sequence. H_t = Σ_{j≤t} tok_j·P^(t−j) + h·P^(t+1),
    computed as P^t·cumsum(tok_j·P^−j) (mod 2^64; P odd, so invertible)."""
    n = int(pos.max()) + 2 if pos.size else 1
    powers = np.ones(n, dtype=np.uint64)
    inverse = np.ones(n, dtype=np.uint64)
    inv_p = np.uint64(pow(int(_P), -1, 1 << 64))
    with np.errstate(over="ignore"):
        for i in range(1, n):
            powers[i] = powers[i - 1] * _P
            inverse[i] = inverse[i - 1] * inv_p
        terms = (token_id.astype(np.uint64) + np.uint64(1)) * inverse[pos]
        sums = np.cumsum(terms, dtype=np.uint64)
        new = np.r_[True, seq_id[1:] != seq_id[:-1]] if seq_id.size else np.zeros(0, bool)
        starts = np.flatnonzero(new)
        start_of_row = starts[np.cumsum(new) - 1]
        offset = np.where(start_of_row > 0, sums[np.maximum(start_of_row - 1, 0)], np.uint64(0))
        within = sums - offset
        heads = pd.Series(seq_id).map(prompt_hash).fillna(0).to_numpy(np.uint64)
        return powers[pos] * within + heads * powers[pos + 1]


def prompt_hashes(sequences: pd.DataFrame) -> dict[int, int]:
    """seq_id → a 64-bit hash of its prompt token ids (0 without them)."""
    out = {}
    for seq_id, ids in zip(sequences["seq_id"], sequences["prompt_token_ids"], strict=True):
        raw = b"" if ids is None else np.asarray(ids, dtype=np.int64).tobytes()
        out[int(seq_id)] = int.from_bytes(hashlib.blake2b(raw, digest_size=8).digest(), "little")
    return out


def _side(keys: np.ndarray, values: np.ndarray, versions: np.ndarray, side: str) -> Unchanged:
    """Pairs (first occurrence per (key, version) against the first occurrence of the key) at different versions.
    Only the rows of repeated keys are sorted (one hashed pass finds them: most contexts occur once); stable numpy
    sorts on those, where two pandas drop_duplicates and a duplicated over every row took seconds (#32)."""
    ok = np.isfinite(values) & np.isfinite(versions)
    ok[ok] = pd.Series(keys[ok]).duplicated(keep=False).to_numpy()
    key, value, version = keys[ok], values[ok], versions[ok]
    if not key.size:
        return Unchanged(side, 0, 0, None)
    order = np.lexsort((version, key))  # stable: a (key, version) group's first is its first row
    sorted_key, sorted_version = key[order], version[order]
    new = np.r_[True, (sorted_key[1:] != sorted_key[:-1]) | (sorted_version[1:] != sorted_version[:-1])]
    rows = np.sort(order[new])  # the first row of each (key, version), in row order
    by_key = rows[np.argsort(key[rows], kind="stable")]
    first = np.r_[True, key[by_key[1:]] != key[by_key[:-1]]]  # the key's first (key, version) row
    base = by_key[np.maximum.accumulate(np.where(first, np.arange(by_key.size), 0))]
    others, base = by_key[~first], base[~first]
    if not others.size:
        return Unchanged(side, 0, 0, None)
    in_rows = np.argsort(others)  # in row order, as the pairs were listed
    others, base = others[in_rows], base[in_rows]
    same = value[others] == value[base]
    example = None
    if same.any():
        i = int(np.flatnonzero(same)[0])
        example = (int(version[base[i]]), int(version[others[i]]))
    return Unchanged(side, int(others.size), int(same.sum()), example)


def weights_unchanged(run: Any) -> list[Unchanged]:
    """The check on both sides of a Run (module docstring): [engine, trainer] (a side without log-probs is left
    out). Only the sequences whose prompt comes back under another version are read (none: nothing to test,
    no token read)."""
    seqs = run.sequence_table(["seq_id", "step", "prompt_token_ids", "policy_version", "trainer_version"]).to_pandas()
    if seqs.empty:
        return []
    hashes = prompt_hashes(seqs)
    seqs["prompt_hash"] = seqs["seq_id"].map(hashes)
    labels = {side: seqs[version].astype(float).where(seqs[version].notna(), seqs["step"].astype(float))
              for side, version in (("engine", "policy_version"), ("trainer", "trainer_version"))}
    repeated = set()
    for label in labels.values():
        spread = pd.DataFrame({"h": seqs["prompt_hash"], "v": label}).dropna().groupby("h")["v"].nunique()
        repeated |= set(spread[spread > 1].index)
    if not repeated:
        return [Unchanged(side, 0, 0, None) for side in labels]
    chosen = seqs[seqs["prompt_hash"].isin(repeated)]
    tokens = run.token_table(["seq_id", "pos", "token_id", "rollout_logprob", "train_logprob", "mask"],
                             seq_ids=chosen["seq_id"]).to_pandas()
    keys = context_keys(tokens["seq_id"].to_numpy(np.int64), tokens["pos"].to_numpy(np.int64),
                        tokens["token_id"].to_numpy(np.int64), hashes)
    out = []
    for (side, label), column in zip(labels.items(), ("rollout_logprob", "train_logprob"), strict=True):
        values = tokens[column].to_numpy(np.float64)
        if not np.isfinite(values).any():
            continue
        per_token = tokens["seq_id"].map(pd.Series(label.to_numpy(), index=seqs["seq_id"])).to_numpy(np.float64)
        out.append(_side(keys, values, per_token, side))
    return out
