"""Independent float64 references of the gate families and of what each framework logs about them, written from
the frameworks' source on padded [B, L] matrices (not from rcdiag's code):

- verl @ 1dda039 verl/trainer/ppo/core_algos.py compute_policy_loss_dppo_tv / compute_policy_loss_dppo_kl;
- prime-rl @ 559b447 src/prime_rl/trainer/rl/loss.py default_loss_fn / ipo_loss_fn (per-sample _safe_mean);
- openrlhf 0.11.2 (wheel) openrlhf/models/loss.py PolicyLoss.forward (is_correction_* gating);
- SkyRL @ a956457 skyrl/backends/skyrl_train/utils/off_policy_correction_utils.py;
- ROLL @ 8eb27cc roll/utils/train_infer_corrections.py + roll/pipeline/agentic/utils.py compute_segment_masked_mean;
- NeMo-RL @ 7ea279a nemo_rl/algorithms/grpo.py compute_and_apply_seq_logprob_error_masking and
  nemo_rl/algorithms/loss/loss_functions.py ClippedPGLossFn.
"""
from __future__ import annotations

import math

import numpy as np


def dppo_tv_valid(p, q, adv, hi, lo):
    """verl: valid = where(A > 0, p − p_old ≤ δ_high, p − p_old ≥ −δ_low)."""
    return np.where(adv > 0, (p - q) <= hi, (p - q) >= -lo)


def dppo_kl_valid(a, b, adv, hi, lo):
    p, q = np.exp(a), np.exp(b)
    d = q * (b - a) + (1 - q) * np.log((1.0 - q + 1e-8) / (1.0 - p + 1e-8))
    return np.where(adv > 0, (d <= hi) | (p <= q), (d <= lo) | (p >= q))


def openrlhf(a, b, m, gating, level, low, high):
    """(keep [B, L], is_filter_ratio, vllm_kl) of PolicyLoss in mask mode."""
    valid = m > 0
    if gating == "ratio":
        lr = a - b
        stat = np.exp(lr) if level == "token" else np.exp(_masked_mean_nan(lr, m))[:, None] * np.ones_like(m)
    else:
        p = np.clip(np.exp(b), 1e-6, 1 - 1e-6)
        q = np.clip(np.exp(a), 1e-6, 1 - 1e-6)
        stat = p * np.log(p / q) + (1 - p) * np.log((1 - p) / (1 - q)) if gating == "binary_kl" else np.abs(p - q)
        if level == "seq":
            stat = _masked_mean_nan(stat, m)[:, None] * np.ones_like(m)
    with np.errstate(invalid="ignore"):
        keep = (stat >= low) & (stat <= high)
    filtered = ~keep
    if level == "seq":
        ratio = float(filtered[:, 0].mean())
    else:
        ratio = float(filtered[valid].mean())
    return keep & valid, ratio, float((b - a)[valid].mean())


def _masked_mean_nan(x, m):
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(m > 0, x, 0).sum(-1) / m.sum(-1)


def prime(a, b, m, adv, kind, hi, lo):
    """prime-rl's per-sample metrics, stacked over samples → {name/mean, name/max}."""
    p, q = np.exp(a), np.exp(b)
    diff = p - q
    lr = a - b
    mkl = np.exp(lr) - lr - 1
    if kind == "default":
        inv_hi, inv_lo = diff > hi, diff < -lo
        masked = np.where(adv > 0, inv_hi, inv_lo)
        low_flag, high_flag = (adv < 0) & inv_lo, (adv > 0) & inv_hi
    else:
        masked = np.abs(diff) > hi
    loss_mask = m > 0
    drop, keep = loss_mask & masked, loss_mask & ~masked

    def safe(values, where):
        return np.array([values[i][where[i]].sum() / max(where[i].sum(), 1) for i in range(len(values))])

    per = {"is_masked": safe(masked.astype(float), loss_mask), "masked_mismatch_kl": safe(mkl, drop),
           "unmasked_mismatch_kl": safe(mkl, keep)}
    if kind == "default":
        per.update({"is_masked_low": safe(low_flag.astype(float), loss_mask),
                    "is_masked_high": safe(high_flag.astype(float), loss_mask),
                    "masked_advantage_positive": safe((adv > 0).astype(float), drop),
                    "masked_advantage_negative": safe((adv < 0).astype(float), drop)})
    out = {}
    for name, values in per.items():
        out[f"{name}/mean"], out[f"{name}/max"] = float(values.mean()), float(values.max())
    return out


def skyrl(a, b, m, kind, low, high):
    """SkyRL's loss_metrics for one correction kind (outlier | token | geo | product), padded to [B, L]."""
    lr = np.where(m > 0, a - b, 0.0)
    ratio = np.exp(np.clip(lr, -20, 20))
    out = {"is_ratio_mean": float((ratio * m).sum() / max(m.sum(), 1)),
           "is_ratio_std": float((ratio * m).std(ddof=1)), "is_ratio_max": float((ratio * m).max()),
           "is_ratio_min": float((ratio * m).min())}
    rows = m.shape[0]
    if kind == "outlier":
        over = (ratio > high) & (m > 0)
        under = (ratio < low) & (m > 0)
        ok = (~over & ~under | (m == 0)).all(-1)
        out.update(outlier_seq_masked_ratio=float((~ok).sum() / rows), outlier_seq_over_high_ratio=float(
            over.any(-1).sum() / rows), outlier_seq_under_low_ratio=float(under.any(-1).sum() / rows))
        keep = ok[:, None] & (m > 0)
    elif kind == "token":
        inb = (ratio >= low) & (ratio <= high)
        out["token_mask_ratio"] = float(((~inb) & (m > 0)).sum() / max((m > 0).sum(), 1))
        keep = inb & (m > 0)
    else:
        s = (lr * m).sum(-1)
        value = np.exp(np.clip(s / np.maximum(m.sum(-1), 1.0), -20, 20)) if kind == "geo" else np.exp(
            np.clip(s, -20, 20))
        over, under = value > high, value < low
        p = "geo_sequence_mask" if kind == "geo" else "product_sequence_mask"
        out.update({f"{p}_masked_ratio": float((over | under).sum() / rows),
                    f"{p}_over_high_ratio": float(over.sum() / rows), f"{p}_under_low_ratio": float(under.sum() / rows)})
        keep = (~over & ~under)[:, None] & (m > 0)
    return out, keep


def roll_segments(values, mask):
    """compute_segment_masked_mean: each run of mask = 1 gets its mean, 0 elsewhere."""
    out = np.zeros_like(values)
    for i in range(mask.shape[0]):
        j = 0
        while j < mask.shape[1]:
            if mask[i, j] == 1:
                k = j
                while k < mask.shape[1] and mask[i, k] == 1:
                    k += 1
                out[i, j:k] = values[i, j:k].sum() / (k - j)
                j = k
            else:
                j += 1
    return out


def roll_stat(a, b, m, agg, kind):
    lr = np.where(m > 0, a - b, 0.0)
    diff = np.where(m > 0, np.exp(a) - np.exp(b), 0.0)
    t = np.maximum(m.sum(-1, keepdims=True), 1)
    x = lr if kind == "ratio" else diff
    if agg == "token":
        v = x
    elif agg == "geometric":
        v = np.broadcast_to(x.sum(-1, keepdims=True) / t, x.shape)
    elif agg == "sequence":
        v = np.broadcast_to(x.sum(-1, keepdims=True), x.shape)
    else:
        v = roll_segments(x, m)
    return np.exp(v) if kind == "ratio" else v


def roll_means(a, b, m):
    """train_infer_{ratio,diff}_{agg}_mean@sum: seq-mean-token-mean over sequences with a valid token."""
    out = {}
    valid = m.sum(-1) > 0
    for kind in ("ratio", "diff"):
        for agg in ("token", "geometric", "sequence", "segment"):
            v = roll_stat(a, b, m, agg, kind)
            per_seq = np.where(m > 0, v, 0).sum(-1) / np.maximum(m.sum(-1), 1)
            out[f"actor/train_infer_{kind}_{agg}_mean@sum"] = float(per_seq[valid].sum() / max(valid.sum(), 1))
    return out


def nemo(a, b, m, rewards, threshold):
    """The sequence error metrics, then the loss metrics over the new sample mask."""
    lp_error = np.abs(b - a)
    denom = m.sum(-1)
    valid = denom > 0
    seq_err = np.zeros(len(m))
    seq_err[valid] = (np.exp(lp_error * m) * m).sum(-1)[valid] / denom[valid]
    out = {}
    ve = seq_err[valid]
    out["train/max_seq_mult_prob_error"] = float(ve.max()) if ve.size else 0.0
    out["train/mean_seq_mult_prob_error"] = float(ve.mean()) if ve.size else 0.0
    out["train/min_seq_mult_prob_error"] = float(ve.min()) if ve.size else 0.0
    sample = np.ones(len(m))
    keep_seq = (seq_err <= threshold).astype(float) * sample
    diff = sample - keep_seq
    n_masked = int(diff.sum())
    out["train/num_masked_seqs_by_logprob_error"] = n_masked
    out["train/masked_correct_pct"] = float((rewards[diff > 0] == 1).sum() / n_masked) if n_masked else 0.0
    kept = (keep_seq > 0) & valid
    ke = seq_err[kept]
    out["train/max_seq_mult_prob_error_after_mask"] = float(ke.max()) if ke.size else 0.0
    out["train/mean_seq_mult_prob_error_after_mask"] = float(ke.mean()) if ke.size else 0.0
    out["train/min_seq_mult_prob_error_after_mask"] = float(ke.min()) if ke.size else 0.0
    mask = m * keep_seq[:, None]
    n = mask.sum()
    lr = a - b
    mix = np.log(0.5 * np.exp(a) + 0.5 * np.exp(b))
    js = 0.5 * (np.exp(a - mix) - (a - mix) - 1) + 0.5 * (np.exp(b - mix) - (b - mix) - 1)
    for key, v in (("token_mult_prob_error", np.exp(lp_error * mask)), ("gen_kl_error", np.exp(lr) - 1 - lr),
                   ("policy_kl_error", np.exp(-lr) - 1 + lr), ("js_divergence_error", js)):
        out[f"train/{key}"] = float((v * mask).sum() / n) if n else math.nan
    return out
