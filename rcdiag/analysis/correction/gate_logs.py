"""What each framework LOGS about its gate, computed its way from its gate family's Decision on each chunk (one
compiled pass for every setting, gate_kernels.gate_family; mergeable):
verl's dppo actor metrics, prime-rl's per-sample trust-region means, OpenRLHF's is_filter_ratio / vllm_kl,
SkyRL's is_ratio_* (over its padded micro-batch) and mask ratios, NeMo-RL's sequence error statistics and the
loss metrics over the kept sequences, ROLL's final pass rate. The names here are canonical; analysis.keys maps
them to each framework's keys. Sources (file @ commit) are in analysis.correction.gate_defs; the reductions:

- verl (`compute_policy_loss_dppo_tv/kl`): masked_mean over the response mask — pg_clipfrac (masked share),
  ppo_kl = mean(−clamp(ℓ, ±20)), pg_clipfrac_lower = share of kept tokens with ρ > clip_ratio_c (ActorConfig
  default 3.0). With p_old = the rollout's (bypass / `use_rollout_log_probs`), at the first mini-batch.
- prime-rl (`default_loss_fn`, `ipo_loss_fn`): one value per sample (`_safe_mean`: 0 when its mask is empty),
  stacked over every sample of the step, then `/mean` and `/max` (the W&B filter keeps only those): is_masked,
  is_masked_low (A < 0), is_masked_high (A > 0), masked_advantage_positive / _negative (among the masked
  tokens), masked_mismatch_kl / unmasked_mismatch_kl (mean k3 over masked / kept tokens).
- OpenRLHF (`PolicyLoss.forward`): is_filter_ratio = masked share of tokens (token level) or of rows (sequence
  level; a row without a valid token has a NaN mean and counts as filtered); vllm_kl = mean(b − a).
- SkyRL (`compute_off_policy_correction`): is_ratio_mean = masked mean of ρ̂; is_ratio_std / _max / _min over the
  padded [B, W] matrix ρ̂ · loss_mask (W = the longest row count: zeros enter, unbiased std); the mask ratios
  over all B rows.
- NeMo-RL (`compute_and_apply_seq_logprob_error_masking`, then `ClippedPGLossFn` on the new sample mask).
- ROLL (`compute_train_infer_correction`): final_mask_mean = kept share of valid tokens.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from rcdiag.analysis.conventions import LOG_RATIO_CLAMP
from rcdiag.analysis.correction.gate_kernels import GATE_SEQ_COUNTS
from rcdiag.analysis.correction.gate_stats import (
    at_level,
    ell64,
    js_divergence,
    mismatch_k3,
    policy_k3,
    token_statistic,
    valid_counts,
)
from rcdiag.analysis.passes.accum import ExactSum, ExactSums, Extremum, Moments, ratio
from rcdiag.analysis.passes.chunks import TokenChunk

VERL_CLIP_RATIO_C = 3.0
"""verl ActorConfig.clip_ratio_c default (verl/workers/config/actor.py @ 1dda039): DPPO's TIS cap on ρ."""


def _per_sequence(chunk: TokenChunk, values: np.ndarray, where: np.ndarray) -> np.ndarray:
    """Per-sequence sums of `values` over the rows `where` holds: what an ExactSum takes (a sum of per-row values
    added row by row cost the report's gate sweep most of its time, issue #32)."""
    return np.add.reduceat(np.where(where, values, 0.0), chunk.starts)


def _valid_sums(chunk: TokenChunk, key: str, values: np.ndarray) -> np.ndarray:
    """Per-sequence sums of `values` over the valid rows, once per chunk for every setting of every gate."""
    return chunk.memo(("gate_sums", key), lambda: _per_sequence(chunk, values, chunk.mask))


@dataclass
class Decision:
    """One chunk's decisions for every setting of one gate family, reduced (gate_kernels.gate_family; its docstring
    names each array), indexed by setting first. `whole`: the gate keeps or masks whole sequences (sequence level
    or any-token), so a sum over a sequence's kept rows is its sum over its valid rows or 0."""

    counts: np.ndarray
    sums: np.ndarray
    mean: np.ndarray
    m2: np.ndarray
    lo_w: np.ndarray
    hi_w: np.ndarray
    lower: np.ndarray
    seq: np.ndarray
    x_kept: np.ndarray
    x_drop: np.ndarray
    whole: bool

    def seq_count(self, name: str) -> np.ndarray:
        """Per-sequence count gate_kernels.GATE_SEQ_COUNTS[name] of every setting (int64 [J, S]; needs `detail`)."""
        return self.seq[GATE_SEQ_COUNTS.index(name)]

    def kept_sums(self, chunk: TokenChunk, key: str, values: np.ndarray) -> np.ndarray:
        """Per-sequence sums of `values` over the rows each setting keeps (float64 [J, S]), for a gate of whole
        sequences: the valid rows' sums (the same bits as summing the kept rows alone) where the sequence is kept,
        else 0."""
        if not self.whole:
            raise ValueError("kept_sums: a gate that masks single tokens reduces its row values in the kernel")
        return np.where(self.seq_count("kept") > 0, _valid_sums(chunk, key, values), 0.0)


class Extra:
    """A framework's logged numbers of every setting of one gate family (`settings`, in the family's order):
    `update(chunk, d, adv, rewards)` with the family's Decision, `merge`, `finish(j, rows, valid)` → setting j's
    numbers. Each update is a numpy step over the family's [J, S] arrays, not a Python loop over its settings
    (issue #32: per setting per chunk, the extras were a fifth of the gate sweep); a number the same for every
    setting (a sum over the valid rows) is kept once. `DETAIL`: it reads the per-sequence counts;
    `row_values(chunk)`: row values (float64 [n]) whose sums over the kept / masked rows of each sequence it reads
    (x_kept / x_drop, in this order); `row_flag(chunk)`: rows whose kept count it reads (Decision.lower)."""

    DETAIL = False

    def __init__(self, settings: Sequence[Any]) -> None:
        self.size = len(settings)

    def counter(self) -> np.ndarray:
        """A count per setting (int64 [J], zeros)."""
        return np.zeros(self.size, np.int64)

    def row_values(self, chunk: TokenChunk) -> list[np.ndarray]:
        return []

    def row_flag(self, chunk: TokenChunk) -> np.ndarray | None:
        return None


def _masked(d: Decision) -> np.ndarray:
    """Valid rows each setting masks on the chunk (int64 [J])."""
    return d.counts[:, 0] - d.counts[:, 1]


class VerlDppo(Extra):
    def __init__(self, settings: Sequence[Any]) -> None:
        super().__init__(settings)
        self.ppo_kl, self.lower, self.masked = ExactSum(), self.counter(), self.counter()

    def row_flag(self, chunk: TokenChunk) -> np.ndarray:
        return chunk.memo(("verl", "above_c"), lambda: chunk.log_ratio(LOG_RATIO_CLAMP) > math.log(VERL_CLIP_RATIO_C))

    def update(self, chunk: TokenChunk, d: Decision, adv: np.ndarray, rewards: np.ndarray) -> None:
        self.ppo_kl.add(_valid_sums(chunk, "-lhat", -chunk.log_ratio(LOG_RATIO_CLAMP)))
        self.masked += _masked(d)
        self.lower += d.lower

    def merge(self, other: VerlDppo) -> None:
        self.ppo_kl.merge(other.ppo_kl)
        self.lower += other.lower
        self.masked += other.masked

    def finish(self, j: int, rows: int, valid: int) -> dict[str, float]:
        return {"dppo_clipfrac": ratio(int(self.masked[j]), valid), "dppo_ppo_kl": ratio(self.ppo_kl.value(), valid),
                "dppo_clipfrac_lower": ratio(int(self.lower[j]), valid)}


PRIME_NAMES = ("is_masked", "is_masked_low", "is_masked_high", "masked_advantage_positive",
               "masked_advantage_negative", "masked_mismatch_kl", "unmasked_mismatch_kl")


class PrimeMasks(Extra):
    """prime-rl's per-sample trust-region metrics (`signed`: the default loss logs the sign split too)."""

    DETAIL = True

    def __init__(self, settings: Sequence[Any], signed: bool) -> None:
        super().__init__(settings)
        self.names = PRIME_NAMES if signed else ("is_masked", "masked_mismatch_kl", "unmasked_mismatch_kl")
        self.sums = ExactSums(len(self.names) * self.size)  # name q, setting j: sum q·J + j
        self.maxes = np.full((len(self.names), self.size), -math.inf)
        self.samples = 0

    def row_values(self, chunk: TokenChunk) -> list[np.ndarray]:
        return [mismatch_k3(chunk)]

    def update(self, chunk: TokenChunk, d: Decision, adv: np.ndarray, rewards: np.ndarray) -> None:
        valid, kept = valid_counts(chunk), d.seq_count("kept")
        drop = valid - kept

        def mean(total: np.ndarray, count: np.ndarray) -> np.ndarray:  # prime-rl's _safe_mean per sample
            return total / np.maximum(count, 1)

        values = {"is_masked": lambda: mean(drop, valid),
                  "is_masked_low": lambda: mean(d.seq_count("low_neg"), valid),
                  "is_masked_high": lambda: mean(d.seq_count("high_pos"), valid),
                  "masked_advantage_positive": lambda: mean(d.seq_count("drop_pos"), drop),
                  "masked_advantage_negative": lambda: mean(d.seq_count("drop_neg"), drop),
                  "masked_mismatch_kl": lambda: mean(d.x_drop[0], drop),
                  "unmasked_mismatch_kl": lambda: mean(d.x_kept[0], kept)}
        self.samples += int(chunk.seq_ids.size)
        per_sample = np.stack([values[name]() for name in self.names])  # [names, J, S]
        self.sums.add(per_sample.reshape(len(self.sums), -1))
        np.maximum(self.maxes, per_sample.max(axis=2), out=self.maxes)

    def merge(self, other: PrimeMasks) -> None:
        self.sums.merge(other.sums)
        np.maximum(self.maxes, other.maxes, out=self.maxes)
        self.samples += other.samples

    def finish(self, j: int, rows: int, valid: int) -> dict[str, float]:
        out = {}
        for q, name in enumerate(self.names):  # a sample without token rows logs 0 for every metric
            out[f"prime_{name}_mean"] = ratio(self.sums.value(q * self.size + j), rows)
            top = float(self.maxes[q, j]) if self.samples else -math.inf
            out[f"prime_{name}_max"] = max(top, 0.0) if rows > self.samples else (top if self.samples else math.nan)
        return out


class OpenRlhf(Extra):
    DETAIL = True

    def __init__(self, settings: Sequence[Any]) -> None:
        super().__init__(settings)
        self.sequence_level = settings[0].gate.level == "sequence"
        self.kl, self.masked, self.seq_filtered, self.seen = ExactSum(), self.counter(), self.counter(), 0

    def update(self, chunk: TokenChunk, d: Decision, adv: np.ndarray, rewards: np.ndarray) -> None:
        self.kl.add(_valid_sums(chunk, "-ell", -ell64(chunk)))
        self.masked += _masked(d)
        # a row without a valid token: NaN mean, filtered
        self.seq_filtered += np.count_nonzero(d.seq_count("kept") == 0, axis=1)
        self.seen += int(chunk.seq_ids.size)

    def merge(self, other: OpenRlhf) -> None:
        self.kl.merge(other.kl)
        self.masked += other.masked
        self.seq_filtered += other.seq_filtered
        self.seen += other.seen

    def finish(self, j: int, rows: int, valid: int) -> dict[str, float]:
        share = ratio(int(self.seq_filtered[j]) + rows - self.seen, rows) if self.sequence_level \
            else ratio(int(self.masked[j]), valid)
        return {"is_filter_ratio": share, "vllm_kl": ratio(self.kl.value(), valid)}


class SkyRl(Extra):
    """SkyRL's is_ratio_* over the padded micro-batch and the mask ratios of its gate's kind (outlier | token |
    geo | product)."""

    DETAIL = True

    def __init__(self, settings: Sequence[Any]) -> None:
        super().__init__(settings)
        self.kind = settings[0].gate.name.split("_")[1]
        # a row without a valid token has the sequence ratio exp(0) = 1: out of band only if the band excludes 1
        self.empty_over = np.array([s.hi < 1.0 for s in settings], np.bool_)
        self.empty_under = np.array([s.lo > 1.0 for s in settings], np.bool_)
        self.rho_sum, self.moments, self.ext = ExactSum(), Moments(), Extremum()  # the valid rows': one for all
        self.valid = self.width = self.seen = 0
        self.counts = {k: self.counter() for k in ("masked", "over", "under")}

    def update(self, chunk: TokenChunk, d: Decision, adv: np.ndarray, rewards: np.ndarray) -> None:
        sums, moments, lo, hi = chunk.memo(("skyrl", "rho"), lambda: _ratio_summary(chunk))
        self.rho_sum.add(sums)
        self.moments.merge(Moments(moments.n, moments.mean, moments.m2))  # = moments.add of the chunk's ρ
        if moments.n:
            self.ext.add_scalar(lo)
            self.ext.add_scalar(hi)
        self.valid += moments.n
        self.width = max(self.width, int(chunk.lengths.max()))
        self.seen += int(chunk.seq_ids.size)
        if self.kind == "token":
            self.counts["masked"] += _masked(d)
            return
        over, under = d.seq_count("high") > 0, d.seq_count("low") > 0
        if self.kind != "outlier":  # geo / product: the per-sequence ratio against its band
            empty = chunk.counts == 0
            over = over | (empty & self.empty_over[:, None])
            under = under | (empty & self.empty_under[:, None])
        self.counts["over"] += np.count_nonzero(over, axis=1)
        self.counts["under"] += np.count_nonzero(under, axis=1)
        self.counts["masked"] += np.count_nonzero((d.seq_count("kept") < chunk.counts) | over | under, axis=1)

    def merge(self, other: SkyRl) -> None:
        self.rho_sum.merge(other.rho_sum)
        self.moments.merge(other.moments)
        self.ext.merge(other.ext)
        self.valid += other.valid
        self.width = max(self.width, other.width)
        self.seen += other.seen
        for k in self.counts:
            self.counts[k] += other.counts[k]

    def finish(self, j: int, rows: int, valid: int) -> dict[str, float]:
        cells = rows * self.width
        zeros = cells - self.valid
        padded = Moments(self.moments.n, self.moments.mean, self.moments.m2)
        padded.merge(Moments(zeros, 0.0, 0.0))
        std = math.sqrt(max(padded.var * cells / (cells - 1), 0.0)) if cells > 1 else math.nan
        out = {"skyrl_is_ratio_mean": self.rho_sum.value() / max(self.valid, 1), "skyrl_is_ratio_std": std,
               "skyrl_is_ratio_max": max(self.ext.hi, 0.0) if zeros else self.ext.hi,
               "skyrl_is_ratio_min": 0.0 if zeros else self.ext.lo}
        prefix = {"outlier": "outlier_seq", "geo": "geo_sequence_mask", "product": "product_sequence_mask"}
        counts = {k: int(v[j]) for k, v in self.counts.items()}
        if self.kind == "token":
            out["token_mask_ratio"] = counts["masked"] / max(valid, 1)
            return out
        p, unseen = prefix[self.kind], (rows - self.seen) if self.kind != "outlier" else 0
        empty_over, empty_under = int(self.empty_over[j]), int(self.empty_under[j])
        over = counts["over"] + unseen * empty_over
        under = counts["under"] + unseen * empty_under
        masked = counts["masked"] + unseen * int(empty_over or empty_under)
        out.update({f"{p}_masked_ratio": ratio(masked, rows), f"{p}_over_high_ratio": ratio(over, rows),
                    f"{p}_under_low_ratio": ratio(under, rows)})
        return out


def _ratio_summary(chunk: TokenChunk) -> tuple[np.ndarray, Moments, float, float]:
    """The valid rows' ρ̂ (±20 clamp) once per chunk for every SkyRL setting: per-sequence sums, moments, min, max."""
    rows = chunk.ratio(LOG_RATIO_CLAMP)
    rho = rows[chunk.mask]
    moments = Moments()
    moments.add(rho)
    return (_per_sequence(chunk, rows, chunk.mask), moments, float(rho.min()) if rho.size else math.inf,
            float(rho.max()) if rho.size else -math.inf)


NEMO_SUMS = ("mult", "gen_kl", "policy_kl", "js")
"""NeMo-RL's loss metrics over the kept tokens (NemoSeqError.sums, in this order)."""


class NemoSeqError(Extra):
    """NeMo-RL's sequence error statistics (before / after the mask) and its loss metrics over the kept tokens (its
    gate masks whole sequences: Decision.kept_sums). The statistics before the mask are one for every setting."""

    DETAIL = True

    def __init__(self, settings: Sequence[Any]) -> None:
        super().__init__(settings)
        self.thresholds = np.array([s.hi for s in settings], np.float64)
        self.all_ext, self.all_sum, self.all_n = Extremum(), ExactSum(), 0
        self.kept_lo, self.kept_hi = np.full(self.size, math.inf), np.full(self.size, -math.inf)
        self.kept_sum, self.kept_n = ExactSums(self.size), self.counter()
        self.masked, self.correct, self.tokens = self.counter(), self.counter(), self.counter()
        self.sums = ExactSums(len(NEMO_SUMS) * self.size)  # name q, setting j: sum q·J + j

    def update(self, chunk: TokenChunk, d: Decision, adv: np.ndarray, rewards: np.ndarray) -> None:
        valid = chunk.counts > 0
        # δ-independent rows, once per chunk for the grid and the peer numbers (analysis.metrics.peer_logs.NemoLogs)
        mult = token_statistic(chunk, "mult_prob_error")  # its gate's statistic: exp|ℓ|
        gen_kl, policy_kl, js = mismatch_k3(chunk), policy_k3(chunk), js_divergence(chunk)
        error = at_level(chunk, "mult_prob_error", "sequence", "mean")[valid]  # its gate's value, per sequence
        masked = error > self.thresholds[:, None]  # [J, S']
        self.all_ext.add(error)
        self.all_sum.add(error)
        self.all_n += error.size
        if error.size:
            self.kept_lo = np.minimum(self.kept_lo, np.where(masked, math.inf, error).min(axis=1))
            self.kept_hi = np.maximum(self.kept_hi, np.where(masked, -math.inf, error).max(axis=1))
        self.kept_sum.add(np.where(masked, 0.0, error))  # a 0 for a masked sequence: the same exact sum
        self.kept_n += np.count_nonzero(~masked, axis=1)
        self.masked += np.count_nonzero(masked, axis=1)
        self.correct += np.count_nonzero(masked & (rewards[chunk.starts][valid] == 1), axis=1)
        self.tokens += d.counts[:, 1]
        rows = {"mult": mult, "gen_kl": gen_kl, "policy_kl": policy_kl, "js": js}
        with np.errstate(over="ignore", invalid="ignore"):  # rows not kept are left out below
            kept = np.stack([d.kept_sums(chunk, "nemo_" + name, rows[name]) for name in NEMO_SUMS])
        self.sums.add(kept.reshape(len(self.sums), -1))

    def merge(self, other: NemoSeqError) -> None:
        self.all_ext.merge(other.all_ext)
        self.all_sum.merge(other.all_sum)
        self.all_n += other.all_n
        np.minimum(self.kept_lo, other.kept_lo, out=self.kept_lo)
        np.maximum(self.kept_hi, other.kept_hi, out=self.kept_hi)
        self.kept_sum.merge(other.kept_sum)
        for name in ("kept_n", "masked", "correct", "tokens"):
            getattr(self, name)[:] += getattr(other, name)
        self.sums.merge(other.sums)

    def finish(self, j: int, rows: int, valid: int) -> dict[str, float]:
        out: dict[str, float] = {}
        kept_n = int(self.kept_n[j])
        stats = (("", self.all_ext.lo, self.all_ext.hi, self.all_sum.value(), self.all_n),
                 ("_after_mask", float(self.kept_lo[j]), float(self.kept_hi[j]), self.kept_sum.value(j), kept_n))
        for suffix, lo, hi, total, n in stats:
            some = n > 0
            out[f"max_seq_mult_prob_error{suffix}"] = hi if some else 0.0
            out[f"mean_seq_mult_prob_error{suffix}"] = total / n if some else 0.0
            out[f"min_seq_mult_prob_error{suffix}"] = lo if some else 0.0
        masked = int(self.masked[j])
        out["num_masked_seqs_by_logprob_error"] = masked
        out["masked_correct_pct"] = int(self.correct[j]) / masked if masked else 0.0
        names = {"mult": "token_mult_prob_error", "gen_kl": "gen_kl_error", "policy_kl": "policy_kl_error",
                 "js": "js_divergence_error"}
        tokens = int(self.tokens[j])
        out.update({f"nemo_kept_{names[k]}": ratio(self.sums.value(q * self.size + j), tokens)
                    for q, k in enumerate(NEMO_SUMS)})
        return out


class RollFinal(Extra):
    def __init__(self, settings: Sequence[Any]) -> None:
        super().__init__(settings)
        self.kept = self.counter()

    def update(self, chunk: TokenChunk, d: Decision, adv: np.ndarray, rewards: np.ndarray) -> None:
        self.kept += d.counts[:, 1]

    def merge(self, other: RollFinal) -> None:
        self.kept += other.kept

    def finish(self, j: int, rows: int, valid: int) -> dict[str, float]:
        return {"train_infer_final_mask_mean": ratio(int(self.kept[j]), valid)}


def extras_for(settings: Sequence[Any]) -> list[Extra]:
    """The framework-number reducers of a family of settings of one gate (by its framework and name)."""
    g = settings[0].gate
    if g.name in ("dppo_tv", "dppo_kl"):
        return [VerlDppo(settings), *([PrimeMasks(settings, True)] if g.name == "dppo_tv" else [])]
    if g.name in ("ipo", "two_sided_kl"):
        return [PrimeMasks(settings, False)]
    if g.framework == "openrlhf":
        return [OpenRlhf(settings)]
    if g.framework == "skyrl":
        return [SkyRl(settings)]
    if g.framework == "nemo-rl":
        return [NemoSeqError(settings)]
    if g.framework == "roll":
        return [RollFinal(settings)]
    return []
