"""What each framework LOGS about its gate, computed its way from its gate family's Decision on each chunk (one
compiled pass for every setting, kernels.gate_family; mergeable):
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
from rcdiag.analysis.kernels import GATE_SEQ_COUNTS

VERL_CLIP_RATIO_C = 3.0
"""verl ActorConfig.clip_ratio_c default (verl/workers/config/actor.py @ 1dda039): DPPO's TIS cap on ρ."""


def _per_sequence(chunk: TokenChunk, values: np.ndarray, where: np.ndarray) -> np.ndarray:
    """Per-sequence sums of `values` over the rows `where` holds: what an ExactSum takes (a sum of per-row values
    added row by row cost the report's gate sweep most of its time, issue #32)."""
    return np.add.reduceat(np.where(where, values, 0.0), chunk.starts)


def _valid_sums(chunk: TokenChunk, key: str, values: np.ndarray) -> np.ndarray:
    """Per-sequence sums of `values` over the valid rows, once per chunk for every setting of every gate."""
    return chunk.memo(("gate_sums", key), lambda: _per_sequence(chunk, values, chunk.mask))


def _valid_counts(chunk: TokenChunk) -> np.ndarray:
    """Valid rows per sequence (int64 [S]), once per chunk."""
    return chunk.memo(("gate", "valid"), lambda: np.add.reduceat(chunk.mask.view(np.int8), chunk.starts,
                                                                dtype=np.int64))


@dataclass
class Decision:
    """One chunk's decisions for every setting of one gate family, reduced (kernels.gate_family; its docstring
    names each array); the setting's index `j` selects its numbers. `whole`: the gate keeps or masks whole
    sequences (sequence level or any-token), so a sum over a sequence's kept rows is its sum over its valid rows
    or 0."""

    counts: np.ndarray
    per_w: np.ndarray
    per_rho: np.ndarray
    per_rho2: np.ndarray
    mean: np.ndarray
    m2: np.ndarray
    lo_w: np.ndarray
    hi_w: np.ndarray
    lower: np.ndarray
    seq: np.ndarray
    x_kept: np.ndarray
    x_drop: np.ndarray
    whole: bool

    def seq_count(self, name: str, j: int) -> np.ndarray:
        """Per-sequence count kernels.GATE_SEQ_COUNTS[name] of setting j (int64 [S]; needs `detail`)."""
        return self.seq[GATE_SEQ_COUNTS.index(name), j]

    def kept_sums(self, chunk: TokenChunk, key: str, values: np.ndarray, j: int) -> np.ndarray:
        """Per-sequence sums of `values` over the rows setting j keeps, for a gate of whole sequences: the valid
        rows' sums (the same bits as summing the kept rows alone) where the sequence is kept, else 0."""
        if not self.whole:
            raise ValueError("kept_sums: a gate that masks single tokens reduces its row values in the kernel")
        return np.where(self.seq_count("kept", j) > 0, _valid_sums(chunk, key, values), 0.0)


class Extra:
    """A framework's logged numbers of one gate setting: `update(chunk, d, j, adv, rewards)` with the family's
    Decision and the setting's index, `merge`, `finish(rows, valid)`. `DETAIL`: it reads the per-sequence counts;
    `row_values(chunk)`: row values (float64 [n]) whose sums over the kept / masked rows of each sequence it reads
    (x_kept / x_drop, in this order); `row_flag(chunk)`: rows whose kept count it reads (Decision.lower)."""

    DETAIL = False

    def row_values(self, chunk: TokenChunk) -> list[np.ndarray]:
        return []

    def row_flag(self, chunk: TokenChunk) -> np.ndarray | None:
        return None


class VerlDppo(Extra):
    def __init__(self) -> None:
        self.ppo_kl, self.lower, self.masked = ExactSum(), 0, 0

    def row_flag(self, chunk: TokenChunk) -> np.ndarray:
        return chunk.memo(("verl", "above_c"), lambda: chunk.log_ratio(LOG_RATIO_CLAMP) > math.log(VERL_CLIP_RATIO_C))

    def update(self, chunk: TokenChunk, d: Decision, j: int, adv: np.ndarray, rewards: np.ndarray) -> None:
        self.ppo_kl.add(_valid_sums(chunk, "-lhat", -chunk.log_ratio(LOG_RATIO_CLAMP)))
        self.masked += int(d.counts[j, 0] - d.counts[j, 1])
        self.lower += int(d.lower[j])

    def merge(self, other: VerlDppo) -> None:
        self.ppo_kl.merge(other.ppo_kl)
        self.lower += other.lower
        self.masked += other.masked

    def finish(self, rows: int, valid: int) -> dict[str, float]:
        return {"dppo_clipfrac": ratio(self.masked, valid), "dppo_ppo_kl": ratio(self.ppo_kl.value(), valid),
                "dppo_clipfrac_lower": ratio(self.lower, valid)}


PRIME_NAMES = ("is_masked", "is_masked_low", "is_masked_high", "masked_advantage_positive",
               "masked_advantage_negative", "masked_mismatch_kl", "unmasked_mismatch_kl")


class PrimeMasks(Extra):
    """prime-rl's per-sample trust-region metrics (`signed`: the default loss logs the sign split too)."""

    DETAIL = True

    def __init__(self, signed: bool) -> None:
        self.names = PRIME_NAMES if signed else ("is_masked", "masked_mismatch_kl", "unmasked_mismatch_kl")
        self.sums = {n: ExactSum() for n in self.names}
        self.maxes = {n: Extremum() for n in self.names}
        self.samples = 0

    def row_values(self, chunk: TokenChunk) -> list[np.ndarray]:
        return [chunk.memo(("prime", "mismatch"), lambda: k3(ell64(chunk)))]  # once per chunk for the grid

    def update(self, chunk: TokenChunk, d: Decision, j: int, adv: np.ndarray, rewards: np.ndarray) -> None:
        valid, kept = _valid_counts(chunk), d.seq_count("kept", j)
        drop = valid - kept

        def mean(total: np.ndarray, count: np.ndarray) -> np.ndarray:  # prime-rl's _safe_mean per sample
            return total / np.maximum(count, 1)

        values = {"is_masked": lambda: mean(drop, valid),
                  "is_masked_low": lambda: mean(d.seq_count("low_neg", j), valid),
                  "is_masked_high": lambda: mean(d.seq_count("high_pos", j), valid),
                  "masked_advantage_positive": lambda: mean(d.seq_count("drop_pos", j), drop),
                  "masked_advantage_negative": lambda: mean(d.seq_count("drop_neg", j), drop),
                  "masked_mismatch_kl": lambda: mean(d.x_drop[0, j], drop),
                  "unmasked_mismatch_kl": lambda: mean(d.x_kept[0, j], kept)}
        self.samples += int(chunk.seq_ids.size)
        for name in self.names:
            value = values[name]()
            self.sums[name].add(value)
            self.maxes[name].add(value)

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


class OpenRlhf(Extra):
    DETAIL = True

    def __init__(self, sequence_level: bool) -> None:
        self.sequence_level = sequence_level
        self.kl, self.masked, self.seq_filtered, self.seen = ExactSum(), 0, 0, 0

    def update(self, chunk: TokenChunk, d: Decision, j: int, adv: np.ndarray, rewards: np.ndarray) -> None:
        self.kl.add(_valid_sums(chunk, "-ell", -ell64(chunk)))
        self.masked += int(d.counts[j, 0] - d.counts[j, 1])
        kept = d.seq_count("kept", j)
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


class SkyRl(Extra):
    """SkyRL's is_ratio_* over the padded micro-batch and the mask ratios of `kind` (outlier | token | geo |
    product)."""

    DETAIL = True

    def __init__(self, kind: str, lo: float, hi: float) -> None:
        self.kind = kind
        # a row without a valid token has the sequence ratio exp(0) = 1: out of band only if the band excludes 1
        self.empty_over, self.empty_under = int(hi < 1.0), int(lo > 1.0)
        self.rho_sum, self.moments, self.ext = ExactSum(), Moments(), Extremum()
        self.valid = self.width = self.seen = 0
        self.counts = dict.fromkeys(("masked", "over", "under"), 0)

    def update(self, chunk: TokenChunk, d: Decision, j: int, adv: np.ndarray, rewards: np.ndarray) -> None:
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
            self.counts["masked"] += int(d.counts[j, 0] - d.counts[j, 1])
            return
        over, under = d.seq_count("high", j) > 0, d.seq_count("low", j) > 0
        if self.kind != "outlier":  # geo / product: the per-sequence ratio against its band
            empty = chunk.counts == 0
            over = over | (empty & bool(self.empty_over))
            under = under | (empty & bool(self.empty_under))
        self.counts["over"] += int(np.count_nonzero(over))
        self.counts["under"] += int(np.count_nonzero(under))
        self.counts["masked"] += int(np.count_nonzero((d.seq_count("kept", j) < chunk.counts) | over | under))

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


def _ratio_summary(chunk: TokenChunk) -> tuple[np.ndarray, Moments, float, float]:
    """The valid rows' ρ̂ (±20 clamp) once per chunk for every SkyRL setting: per-sequence sums, moments, min, max."""
    rows = chunk.ratio(LOG_RATIO_CLAMP)
    rho = rows[chunk.mask]
    moments = Moments()
    moments.add(rho)
    return (_per_sequence(chunk, rows, chunk.mask), moments, float(rho.min()) if rho.size else math.inf,
            float(rho.max()) if rho.size else -math.inf)


class NemoSeqError(Extra):
    """NeMo-RL's sequence error statistics (before / after the mask) and its loss metrics over the kept tokens (its
    gate masks whole sequences: Decision.kept_sums)."""

    DETAIL = True

    def __init__(self, threshold: float) -> None:
        self.threshold = threshold
        self.all, self.kept = (Extremum(), ExactSum(), [0]), (Extremum(), ExactSum(), [0])
        self.masked = self.correct = self.tokens = 0
        self.sums = {n: ExactSum() for n in ("mult", "gen_kl", "policy_kl", "js")}

    def update(self, chunk: TokenChunk, d: Decision, j: int, adv: np.ndarray, rewards: np.ndarray) -> None:
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
        self.tokens += int(d.counts[j, 1])
        with np.errstate(over="ignore", invalid="ignore"):  # rows not kept are left out below
            for name, values in (("mult", mult), ("gen_kl", gen_kl), ("policy_kl", policy_kl), ("js", js)):
                self.sums[name].add(d.kept_sums(chunk, "nemo_" + name, values, j))

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


class RollFinal(Extra):
    def __init__(self) -> None:
        self.kept = 0

    def update(self, chunk: TokenChunk, d: Decision, j: int, adv: np.ndarray, rewards: np.ndarray) -> None:
        self.kept += int(d.counts[j, 1])

    def merge(self, other: RollFinal) -> None:
        self.kept += other.kept

    def finish(self, rows: int, valid: int) -> dict[str, float]:
        return {"train_infer_final_mask_mean": ratio(self.kept, valid)}


def extras_for(setting: Any) -> list[Extra]:
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

