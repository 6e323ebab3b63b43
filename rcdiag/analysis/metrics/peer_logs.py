"""The mismatch numbers SkyRL, NeMo-RL, prime-rl and ROLL log on every step (no correction configured), as
mergeable reductions that `compute_metrics(..., keys=<framework>)` adds (analysis.metrics.compute calls `accumulator`).
Names are canonical; analysis.keys maps them to each framework's keys. Each pools the data it is given: one
logged value when given exactly the group the framework reduces over (the step's training batch for SkyRL's
trainer metrics, NeMo-RL's one global batch, prime-rl's gathered step, ROLL's pipeline-level batch).

- SkyRL @ a956457 `skyrl/train/trainer.py` (after the forward pass): |b − a| over the loss mask →
  rollout_train_logprobs_abs_diff_{max,min,mean,std} (torch.std: unbiased).
- NeMo-RL @ 7ea279a `nemo_rl/algorithms/loss/loss_functions.py` ClippedPGLossFn (token-normalised by the global
  valid-token count, summed over micro-batches: the token mean of the global batch): token_mult_prob_error =
  mean exp(|a − b|); gen_kl_error = mean k3 of log(p_train/p_gen) (kl_type k3, no clamps); policy_kl_error =
  mean k3 of log(p_gen/p_train); js_divergence_error; sampling_importance_ratio = mean exp(a − b) (no
  correction; inf → 0 by nan_to_num); and `grpo.py` compute_and_apply_seq_logprob_error_masking's
  {max,mean,min}_seq_mult_prob_error (over sequences with a valid token) with the _after_mask copies (no
  threshold set: the same), num_masked_seqs_by_logprob_error 0, masked_correct_pct 0.
- prime-rl @ 559b447 `src/prime_rl/trainer/rl/train.py` + `trainer/utils.py` Tensors.compute_stats: the per-token
  mismatch_kl = ρ − ℓ − 1 over the loss mask, gathered over micro-steps and ranks → /mean, /std (unbiased),
  /max (the W&B filter drops /median and /min).
- ROLL @ 8eb27cc `roll/utils/train_infer_corrections.py`: train_infer_{ratio,diff}_{token,geometric,sequence,
  segment}_mean@sum = agg_loss seq-mean-token-mean over sequences with a valid token.
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np

from rcdiag.analysis.correction.gate_stats import (
    at_level,
    ell64,
    js_divergence,
    k3,
    mismatch_k3,
    policy_k3,
    rollout64,
    segment_mean,
    sequence_mean,
    token_statistic,
    train64,
)
from rcdiag.analysis.passes.accum import ExactSum, Extremum, Moments, ratio
from rcdiag.analysis.passes.chunks import TokenChunk

ROLL_AGGS = ("token", "geometric", "sequence", "segment")


class _Tokens:
    """Exact sum, moments and extrema of one per-token value over the valid tokens."""

    def __init__(self) -> None:
        self.total, self.moments, self.ext = ExactSum(), Moments(), Extremum()

    def add(self, values: np.ndarray) -> None:
        if values.size:
            self.total.add(values)
            self.moments.add(values)
            self.ext.add(values)

    def merge(self, other: _Tokens) -> None:
        self.total.merge(other.total)
        self.moments.merge(other.moments)
        self.ext.merge(other.ext)

    def mean(self) -> float:
        return ratio(self.total.value(), self.moments.n)

    def std(self) -> float:
        n = self.moments.n
        return math.sqrt(max(self.moments.var * n / (n - 1), 0.0)) if n > 1 else math.nan


class _Peer:
    """Per-token families (`_tokens`) and per-sequence sums (`_seqs`) shared by the framework reducers."""

    token_names: tuple[str, ...] = ()
    seq_names: tuple[str, ...] = ()

    def __init__(self) -> None:
        self.tokens = {n: _Tokens() for n in self.token_names}
        self.seqs = {n: _Tokens() for n in self.seq_names}

    def merge(self, other: _Peer) -> _Peer:
        for mine, theirs in ((self.tokens, other.tokens), (self.seqs, other.seqs)):
            for name, acc in mine.items():
                acc.merge(theirs[name])
        return self


class SkyRlLogs(_Peer):
    token_names = ("abs_diff",)

    def update_chunk(self, chunk: TokenChunk) -> None:
        self.tokens["abs_diff"].add(np.abs(ell64(chunk)[chunk.mask]))

    def finish(self) -> dict[str, float]:
        t = self.tokens["abs_diff"]
        some = t.moments.n > 0
        return {"skyrl_abs_diff_max": t.ext.hi if some else math.nan, "skyrl_abs_diff_min": t.ext.lo if some else
                math.nan, "skyrl_abs_diff_mean": t.mean(), "skyrl_abs_diff_std": t.std()}


class NemoLogs(_Peer):
    token_names = ("token_mult_prob_error", "gen_kl_error", "policy_kl_error", "js_divergence_error",
                   "sampling_importance_ratio")
    seq_names = ("seq_mult_prob_error",)

    def update_chunk(self, chunk: TokenChunk) -> None:
        mask, lr = chunk.mask, ell64(chunk)
        with np.errstate(over="ignore"):
            weights = np.exp(lr[mask])
        # the rows NeMo-RL's gate numbers use too (analysis.correction.gate_logs.NemoSeqError): computed once per chunk
        values = {"token_mult_prob_error": token_statistic(chunk, "mult_prob_error")[mask],
                  "gen_kl_error": mismatch_k3(chunk)[mask], "policy_kl_error": policy_k3(chunk)[mask],
                  "js_divergence_error": js_divergence(chunk)[mask],
                  "sampling_importance_ratio": np.where(np.isinf(weights), 0.0, weights)}
        for name, v in values.items():
            self.tokens[name].add(v)
        valid = chunk.counts > 0
        self.seqs["seq_mult_prob_error"].add(at_level(chunk, "mult_prob_error", "sequence", "mean")[valid])

    def finish(self) -> dict[str, float]:
        out = {name: acc.mean() for name, acc in self.tokens.items()}
        s = self.seqs["seq_mult_prob_error"]
        some = s.moments.n > 0
        for suffix in ("", "_after_mask"):
            out[f"max_seq_mult_prob_error{suffix}"] = s.ext.hi if some else 0.0
            out[f"mean_seq_mult_prob_error{suffix}"] = s.mean() if some else 0.0
            out[f"min_seq_mult_prob_error{suffix}"] = s.ext.lo if some else 0.0
        out.update(num_masked_seqs_by_logprob_error=0, masked_correct_pct=0.0)
        return out


class PrimeLogs(_Peer):
    token_names = ("mismatch_kl",)

    def update_chunk(self, chunk: TokenChunk) -> None:
        self.tokens["mismatch_kl"].add(k3(ell64(chunk)[chunk.mask]))

    def finish(self) -> dict[str, float]:
        t = self.tokens["mismatch_kl"]
        return {"prime_mismatch_kl_mean": t.mean(), "prime_mismatch_kl_std": t.std(),
                "prime_mismatch_kl_max": t.ext.hi if t.moments.n else math.nan}


class RollLogs(_Peer):
    seq_names = tuple(f"{kind}_{agg}" for kind in ("ratio", "diff") for agg in ROLL_AGGS)

    def update_chunk(self, chunk: TokenChunk) -> None:
        valid, lr = chunk.counts > 0, ell64(chunk)
        diff = np.exp(train64(chunk)) - np.exp(rollout64(chunk))
        with np.errstate(over="ignore"):
            per_token = {"ratio_token": np.exp(lr), "diff_token": diff,
                         "ratio_segment": np.exp(segment_mean(chunk, lr)), "diff_segment": segment_mean(chunk, diff)}
            per_seq = {"ratio_geometric": np.exp(sequence_mean(chunk, lr)), "diff_geometric": sequence_mean(chunk, diff),
                       "ratio_sequence": np.exp(chunk.seq_sum(np.where(chunk.mask, lr, 0.0))),
                       "diff_sequence": chunk.seq_sum(np.where(chunk.mask, diff, 0.0))}
        for name, values in per_token.items():
            per_seq[name] = sequence_mean(chunk, values)
        for name, values in per_seq.items():
            self.seqs[name].add(values[valid])

    def finish(self) -> dict[str, float]:
        return {f"roll_{name}_mean": acc.mean() for name, acc in self.seqs.items()}


_REDUCERS = {"skyrl": SkyRlLogs, "nemo-rl": NemoLogs, "prime-rl": PrimeLogs, "roll": RollLogs}


def accumulator(framework: str) -> Any:
    """The reducer of `framework`'s always-logged numbers, or None for a framework without such extras."""
    make = _REDUCERS.get(framework)
    return make() if make is not None else None
