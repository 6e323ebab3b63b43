"""What each framework LOGS about its gate, computed its way from one gate decision per chunk (mergeable):
verl's dppo actor metrics, prime-rl's per-sample trust-region means, OpenRLHF's is_filter_ratio / vllm_kl,
SkyRL's is_ratio_* (over its padded micro-batch) and mask ratios, NeMo-RL's sequence error statistics and the
loss metrics over the kept sequences, ROLL's final pass rate. The names here are canonical; analysis.keys maps
them to each framework's keys. Sources (file @ commit) are in analysis.gate_defs; the reductions:

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
from dataclasses import dataclass
from typing import Any

import numpy as np

from rcdiag.analysis.accum import ExactSum, Extremum, Moments, ratio
from rcdiag.analysis.chunks import TokenChunk
from rcdiag.analysis.conventions import LOG_RATIO_CLAMP
from rcdiag.analysis.gate_stats import ell64, js_divergence, k3, sequence_mean

VERL_CLIP_RATIO_C = 3.0
"""verl ActorConfig.clip_ratio_c default (verl/workers/config/actor.py @ 1dda039): DPPO's TIS cap on ρ."""


def _per_sequence(chunk: TokenChunk, values: np.ndarray, where: np.ndarray) -> np.ndarray:
    """Per-sequence sums of `values` over the rows `where` holds: what an ExactSum takes (a sum of per-row values
    added row by row cost the report's gate sweep most of its time, issue #32)."""
    return np.add.reduceat(np.where(where, values, 0.0), chunk.starts)


@dataclass
class Decision:
    """A gate's decision on one chunk: rows kept / masked from above / from below (valid rows only), for
    any-token gates the per-sequence over/under flags, else the aggregated statistic per row."""

    keep: np.ndarray
    high: np.ndarray
    low: np.ndarray
    seq_over: np.ndarray | None
    seq_under: np.ndarray | None
    value: np.ndarray | None = None


class VerlDppo:
    def __init__(self) -> None:
        self.ppo_kl, self.lower, self.masked = ExactSum(), 0, 0

    def update(self, chunk: TokenChunk, d: Decision, adv: np.ndarray, rewards: np.ndarray) -> None:
        self.ppo_kl.add(_per_sequence(chunk, -chunk.log_ratio(LOG_RATIO_CLAMP), chunk.mask))
        self.masked += int(np.count_nonzero(chunk.mask & ~d.keep))
        self.lower += int(np.count_nonzero(d.keep & (chunk.log_ratio(LOG_RATIO_CLAMP) > math.log(VERL_CLIP_RATIO_C))))

    def merge(self, other: VerlDppo) -> None:
        self.ppo_kl.merge(other.ppo_kl)
        self.lower += other.lower
        self.masked += other.masked

    def finish(self, rows: int, valid: int) -> dict[str, float]:
        return {"dppo_clipfrac": ratio(self.masked, valid), "dppo_ppo_kl": ratio(self.ppo_kl.value(), valid),
                "dppo_clipfrac_lower": ratio(self.lower, valid)}


PRIME_NAMES = ("is_masked", "is_masked_low", "is_masked_high", "masked_advantage_positive",
               "masked_advantage_negative", "masked_mismatch_kl", "unmasked_mismatch_kl")


class PrimeMasks:
    """prime-rl's per-sample trust-region metrics (`signed`: the default loss logs the sign split too)."""

    def __init__(self, signed: bool) -> None:
        self.names = PRIME_NAMES if signed else ("is_masked", "masked_mismatch_kl", "unmasked_mismatch_kl")
        self.sums = {n: ExactSum() for n in self.names}
        self.maxes = {n: Extremum() for n in self.names}
        self.samples = 0

    def update(self, chunk: TokenChunk, d: Decision, adv: np.ndarray, rewards: np.ndarray) -> None:
        mask, starts = chunk.mask, chunk.starts
        drop = mask & ~d.keep
        mismatch = chunk.memo(("prime", "mismatch"), lambda: k3(ell64(chunk)))  # once per chunk for the grid

        def per_seq(values: np.ndarray, where: np.ndarray) -> np.ndarray:  # prime-rl's _safe_mean per sample
            total = np.add.reduceat(np.where(where, values, 0.0), starts)
            return total / np.maximum(np.add.reduceat(where.view(np.int8), starts, dtype=np.int64), 1)

        values = {"is_masked": per_seq(drop.astype(float), mask),
                  "is_masked_low": per_seq(((adv < 0) & d.low).astype(float), mask),
                  "is_masked_high": per_seq(((adv > 0) & d.high).astype(float), mask),
                  "masked_advantage_positive": per_seq((adv > 0).astype(float), drop),
                  "masked_advantage_negative": per_seq((adv < 0).astype(float), drop),
                  "masked_mismatch_kl": per_seq(mismatch, drop), "unmasked_mismatch_kl": per_seq(mismatch, d.keep)}
        self.samples += int(chunk.seq_ids.size)
        for name in self.names:
            self.sums[name].add(values[name])
            self.maxes[name].add(values[name])

    def merge(self, other: PrimeMasks) -> None:
        for name in self.names:
            self.sums[name].merge(other.sums[name])
            self.maxes[name].merge(other.maxes[name])
        self.samples += other.samples

    def finish(self, rows: int, valid: int) -> dict[str, float]:
        out = {}
        for name in self.names:  # a sample without token rows logs 0 for every metric
            out[f"prime_{name}_mean"] = ratio(self.sums[name].value(), rows)
            top = self.maxes[name].hi if self.samples else -math.inf
            out[f"prime_{name}_max"] = max(top, 0.0) if rows > self.samples else (top if self.samples else math.nan)
        return out


class OpenRlhf:
    def __init__(self, sequence_level: bool) -> None:
        self.sequence_level = sequence_level
        self.kl, self.masked, self.seq_filtered, self.seen = ExactSum(), 0, 0, 0

    def update(self, chunk: TokenChunk, d: Decision, adv: np.ndarray, rewards: np.ndarray) -> None:
        self.kl.add(_per_sequence(chunk, -ell64(chunk), chunk.mask))
        self.masked += int(np.count_nonzero(chunk.mask & ~d.keep))
        kept = np.add.reduceat(d.keep.view(np.int8), chunk.starts, dtype=np.int64)
        self.seq_filtered += int(np.count_nonzero(kept == 0))  # a row without a valid token: NaN mean, filtered
        self.seen += int(chunk.seq_ids.size)

    def merge(self, other: OpenRlhf) -> None:
        self.kl.merge(other.kl)
        self.masked += other.masked
        self.seq_filtered += other.seq_filtered
        self.seen += other.seen

    def finish(self, rows: int, valid: int) -> dict[str, float]:
        share = ratio(self.seq_filtered + rows - self.seen, rows) if self.sequence_level else ratio(self.masked, valid)
        return {"is_filter_ratio": share, "vllm_kl": ratio(self.kl.value(), valid)}


class SkyRl:
    """SkyRL's is_ratio_* over the padded micro-batch and the mask ratios of `kind` (outlier | token | geo |
    product)."""

    def __init__(self, kind: str, lo: float, hi: float) -> None:
        self.kind = kind
        # a row without a valid token has the sequence ratio exp(0) = 1: out of band only if the band excludes 1
        self.empty_over, self.empty_under = int(hi < 1.0), int(lo > 1.0)
        self.rho_sum, self.moments, self.ext = ExactSum(), Moments(), Extremum()
        self.valid = self.width = self.seen = 0
        self.counts = dict.fromkeys(("masked", "over", "under"), 0)

    def update(self, chunk: TokenChunk, d: Decision, adv: np.ndarray, rewards: np.ndarray) -> None:
        rows = chunk.ratio(LOG_RATIO_CLAMP)
        rho = rows[chunk.mask]
        self.rho_sum.add(_per_sequence(chunk, rows, chunk.mask))
        self.moments.add(rho)
        self.ext.add(rho)
        self.valid += rho.size
        self.width = max(self.width, int(chunk.lengths.max()))
        self.seen += int(chunk.seq_ids.size)
        kept = np.add.reduceat(d.keep.view(np.int8), chunk.starts, dtype=np.int64)
        if self.kind == "token":
            self.counts["masked"] += int(np.count_nonzero(chunk.mask & ~d.keep))
            return
        if self.kind == "outlier":
            over, under = d.seq_over, d.seq_under
        else:  # geo / product: the per-sequence ratio against its band
            empty = chunk.counts == 0
            over = np.logical_or.reduceat(d.high, chunk.starts) | (empty & bool(self.empty_over))
            under = np.logical_or.reduceat(d.low, chunk.starts) | (empty & bool(self.empty_under))
        self.counts["over"] += int(np.count_nonzero(over))
        self.counts["under"] += int(np.count_nonzero(under))
        self.counts["masked"] += int(np.count_nonzero((kept < chunk.counts) | over | under))

    def merge(self, other: SkyRl) -> None:
        self.rho_sum.merge(other.rho_sum)
        self.moments.merge(other.moments)
        self.ext.merge(other.ext)
        self.valid += other.valid
        self.width = max(self.width, other.width)
        self.seen += other.seen
        for k in self.counts:
            self.counts[k] += other.counts[k]

    def finish(self, rows: int, valid: int) -> dict[str, float]:
        cells = rows * self.width
        zeros = cells - self.valid
        padded = Moments(self.moments.n, self.moments.mean, self.moments.m2)
        padded.merge(Moments(zeros, 0.0, 0.0))
        std = math.sqrt(max(padded.var * cells / (cells - 1), 0.0)) if cells > 1 else math.nan
        out = {"skyrl_is_ratio_mean": self.rho_sum.value() / max(self.valid, 1), "skyrl_is_ratio_std": std,
               "skyrl_is_ratio_max": max(self.ext.hi, 0.0) if zeros else self.ext.hi,
               "skyrl_is_ratio_min": 0.0 if zeros else self.ext.lo}
        prefix = {"outlier": "outlier_seq", "geo": "geo_sequence_mask", "product": "product_sequence_mask"}
        if self.kind == "token":
            out["token_mask_ratio"] = self.counts["masked"] / max(valid, 1)
            return out
        p, unseen = prefix[self.kind], (rows - self.seen) if self.kind != "outlier" else 0
        over = self.counts["over"] + unseen * self.empty_over
        under = self.counts["under"] + unseen * self.empty_under
        masked = self.counts["masked"] + unseen * int(self.empty_over or self.empty_under)
        out.update({f"{p}_masked_ratio": ratio(masked, rows), f"{p}_over_high_ratio": ratio(over, rows),
                    f"{p}_under_low_ratio": ratio(under, rows)})
        return out


class NemoSeqError:
    """NeMo-RL's sequence error statistics (before / after the mask) and its loss metrics over the kept tokens."""

    def __init__(self, threshold: float) -> None:
        self.threshold = threshold
        self.all, self.kept = (Extremum(), ExactSum(), [0]), (Extremum(), ExactSum(), [0])
        self.masked = self.correct = self.tokens = 0
        self.sums = {n: ExactSum() for n in ("mult", "gen_kl", "policy_kl", "js")}

    def update(self, chunk: TokenChunk, d: Decision, adv: np.ndarray, rewards: np.ndarray) -> None:
        valid = chunk.counts > 0
        lr = ell64(chunk)
        with np.errstate(over="ignore", invalid="ignore"):  # δ-independent rows: once per chunk for the grid
            mult = chunk.memo(("nemo", "mult"), lambda: np.exp(np.abs(lr)))
            gen_kl = chunk.memo(("nemo", "gen_kl"), lambda: k3(lr))
            policy_kl = chunk.memo(("nemo", "policy_kl"), lambda: k3(-lr))
            js = chunk.memo(("nemo", "js"), lambda: js_divergence(chunk))
        error = chunk.memo(("nemo", "error"), lambda: sequence_mean(chunk, mult))[valid]
        masked = error > self.threshold
        for (ext, total, n), values in ((self.all, error), (self.kept, error[~masked])):
            ext.add(values)
            total.add(values)
            n[0] += values.size
        self.masked += int(np.count_nonzero(masked))
        self.correct += int(np.count_nonzero(rewards[chunk.starts][valid][masked] == 1))
        keep = d.keep
        self.tokens += int(np.count_nonzero(keep))
        with np.errstate(over="ignore", invalid="ignore"):  # rows not kept are left out below
            self.sums["mult"].add(_per_sequence(chunk, mult, keep))
            self.sums["gen_kl"].add(_per_sequence(chunk, gen_kl, keep))
            self.sums["policy_kl"].add(_per_sequence(chunk, policy_kl, keep))
            self.sums["js"].add(_per_sequence(chunk, js, keep))

    def merge(self, other: NemoSeqError) -> None:
        for mine, theirs in ((self.all, other.all), (self.kept, other.kept)):
            mine[0].merge(theirs[0])
            mine[1].merge(theirs[1])
            mine[2][0] += theirs[2][0]
        self.masked += other.masked
        self.correct += other.correct
        self.tokens += other.tokens
        for k in self.sums:
            self.sums[k].merge(other.sums[k])

    def finish(self, rows: int, valid: int) -> dict[str, float]:
        out: dict[str, float] = {}
        for suffix, (ext, total, n) in (("", self.all), ("_after_mask", self.kept)):
            some = n[0] > 0
            out[f"max_seq_mult_prob_error{suffix}"] = ext.hi if some else 0.0
            out[f"mean_seq_mult_prob_error{suffix}"] = total.value() / n[0] if some else 0.0
            out[f"min_seq_mult_prob_error{suffix}"] = ext.lo if some else 0.0
        out["num_masked_seqs_by_logprob_error"] = self.masked
        out["masked_correct_pct"] = self.correct / self.masked if self.masked else 0.0
        names = {"mult": "token_mult_prob_error", "gen_kl": "gen_kl_error", "policy_kl": "policy_kl_error",
                 "js": "js_divergence_error"}
        out.update({f"nemo_kept_{names[k]}": ratio(v.value(), self.tokens) for k, v in self.sums.items()})
        return out


class RollFinal:
    def __init__(self) -> None:
        self.kept = 0

    def update(self, chunk: TokenChunk, d: Decision, adv: np.ndarray, rewards: np.ndarray) -> None:
        self.kept += int(np.count_nonzero(d.keep))

    def merge(self, other: RollFinal) -> None:
        self.kept += other.kept

    def finish(self, rows: int, valid: int) -> dict[str, float]:
        return {"train_infer_final_mask_mean": ratio(self.kept, valid)}


def extras_for(setting: Any) -> list[Any]:
    """The framework-number reducers of a gate setting (by its gate's framework and name)."""
    g = setting.gate
    if g.name in ("dppo_tv", "dppo_kl"):
        return [VerlDppo(), *([PrimeMasks(True)] if g.name == "dppo_tv" else [])]
    if g.name in ("ipo", "two_sided_kl"):
        return [PrimeMasks(False)]
    if g.framework == "openrlhf":
        return [OpenRlhf(g.level == "sequence")]
    if g.framework == "skyrl":
        return [SkyRl(g.name.split("_")[1], setting.lo, setting.hi)]
    if g.framework == "nemo-rl":
        return [NemoSeqError(setting.hi)]
    if g.framework == "roll":
        return [RollFinal()]
    return []

