"""Independent references of what verl, TRL and ms-swift LOG, written from their source (not from rcdiag): padded
[B, L] matrices and masked reductions, the way the trainers compute them, in float64 numpy.

- verl v0.9.0 `verl/trainer/ppo/rollout_corr_helper.py` (compute_rollout_correction_and_rejection_mask and the
  functions it calls), keys `rollout_corr/...`.
- TRL v1.9.0 `trl/trainer/grpo_trainer.py` (`_generate_and_score_completions`, the `sampling/...` keys, one rank,
  one generation call).
- ms-swift v4.5.2 `swift/rlhf_trainers/grpo_trainer.py` (`_compute_rollout_offpolicy_metrics`,
  `_apply_rollout_importance_sampling`, `_compute_is_correction_metrics`), one micro-batch, keys
  `rollout_correction/...`.
Float32 details that change a value by more than rounding are emulated: verl's `x + 1e-8` denominators are float32
(= x for counts ≥ 1) and its log thresholds are `torch.log(torch.tensor(x))` in float32. Everything else is float64,
so comparisons with rcdiag use a relative tolerance of ~1e-6 (std and ESS: cancellation and `mean + 1e-8`).
"""
from __future__ import annotations

import math

import numpy as np

CLAMP = 20.0


def padded(tokens, universe=None, junk: float = -7.0):
    """(a, b, m) float64 [B, L] from token rows, rows = sorted seq_ids (+ `universe`); padding and masked
    positions hold `junk` (every masked reduction must ignore it)."""
    ids = sorted(set(tokens["seq_id"].tolist()) | set(universe or ()))
    rows = {s: [] for s in ids}
    for s, _pos, x, y, k in sorted(zip(tokens["seq_id"], tokens["pos"], tokens["train_logprob"],
                                    tokens["rollout_logprob"], tokens["mask"], strict=True)):
        rows[int(s)].append((float(x), float(y), bool(k)))
    width = max([len(r) for r in rows.values()] + [1])
    a = np.full((len(ids), width), junk)
    b = np.full((len(ids), width), junk)
    m = np.zeros((len(ids), width))
    for i, s in enumerate(ids):
        for j, (x, y, k) in enumerate(rows[s]):
            if k:
                a[i, j], b[i, j], m[i, j] = x, y, 1.0
    return a, b, m


def _den(count):
    """verl's float32 `count + 1e-8`."""
    return np.asarray(np.asarray(count + 1e-8, np.float64).astype(np.float32), np.float64)


def masked_mean(x, m, axis=None):
    return np.where(m > 0, x, 0.0).sum(axis=axis) / _den(m.sum(axis=axis))


def masked_sum(x, m, axis=None):
    return np.where(m > 0, x, 0.0).sum(axis=axis)


def _f32_log(x: float) -> float:
    return float(np.log(np.float32(x)))


# ------------------------------------------------------------------------------------------------ verl
def verl(a, b, m, rollout_is=None, threshold="2.0", batch_normalize=False, rollout_rs=None, rs_threshold=None):
    """Every `rollout_corr/` key verl logs for one step batch (decoupled mode)."""
    assert m.any(), "verl raises ValueError without a valid token"
    log_ratio = a - b
    out = {}
    if rollout_is is not None:
        out.update(_verl_is(log_ratio, m, rollout_is, str(threshold), batch_normalize))
    if rollout_rs is not None:
        out.update(_verl_rs(log_ratio, m, rollout_rs, rs_threshold))
    out.update(_verl_offpolicy(a, b, m))
    return {**{f"rollout_corr/{k}": v for k, v in out.items()}, **verl_debug(a, b, m)}


def verl_debug(a, b, m):
    """`verl/utils/debug/metrics.py` calculate_debug_metrics: |exp(a) − exp(b)| over the valid tokens (torch.std is
    unbiased) and torch.corrcoef of the probabilities; no valid token → valid 0 and NaN."""
    if not m.any():
        return {"training/rollout_probs_diff_valid": 0, **dict.fromkeys(
            [f"training/rollout_probs_diff_{k}" for k in ("max", "mean", "std")]
            + ["training/rollout_actor_probs_pearson_corr"], math.nan)}
    pa, pb = np.exp(a[m > 0]), np.exp(b[m > 0])
    diff = np.abs(pa - pb)
    with np.errstate(invalid="ignore", divide="ignore"):
        corr = float(np.corrcoef(np.stack([pa, pb]))[0, 1]) if pa.size > 1 else math.nan
    return {"training/rollout_probs_diff_valid": 1, "training/rollout_probs_diff_max": float(diff.max()),
            "training/rollout_probs_diff_mean": float(diff.mean()),
            "training/rollout_probs_diff_std": float(diff.std(ddof=1)) if diff.size > 1 else math.nan,
            "training/rollout_actor_probs_pearson_corr": corr}


def _verl_is(log_ratio, m, level, threshold, batch_normalize):
    if "_" in threshold:
        lower, upper = (float(x) for x in threshold.split("_"))
    else:
        lower, upper = None, float(threshold)
    if level == "token":
        for_metrics = log_ratio
        raw = np.exp(np.clip(log_ratio, -CLAMP, CLAMP))
    else:
        for_metrics = masked_sum(log_ratio, m, axis=-1)[:, None]
        raw = np.broadcast_to(np.exp(np.clip(for_metrics, -CLAMP, CLAMP)), log_ratio.shape)
    raw = raw * m
    if lower is None:
        w = np.minimum(raw, upper)
    else:
        w = np.where((raw >= lower) & (raw <= upper), raw, 0.0)
    lo = 1.0 / upper if lower is None else lower
    out = {}
    valid = m > 0
    if level == "sequence":
        out["rollout_is_max"] = math.exp(min(float(for_metrics.max()), CLAMP))
        out["rollout_is_min"] = math.exp(float(for_metrics.min()))
        out["rollout_is_mean"] = float(masked_mean(w, m))
        out["rollout_is_ratio_fraction_high"] = float(np.mean(for_metrics > _f32_log(upper)))
        out["rollout_is_ratio_fraction_low"] = float(np.mean(for_metrics < _f32_log(lo)))
    else:
        out["rollout_is_mean"] = float(masked_mean(w, m))
        out["rollout_is_ratio_fraction_high"] = float(masked_mean((raw > upper).astype(float), m))
        out["rollout_is_ratio_fraction_low"] = float(masked_mean((raw < lo).astype(float), m))
        out["rollout_is_max"] = float(w[valid].max())
        out["rollout_is_min"] = float(w[valid].min())
    if m.sum() > 1:
        wc = np.clip(w, 0.0, upper)
        out["rollout_is_std"] = math.sqrt(max(float(masked_mean(wc**2, m) - masked_mean(wc, m) ** 2), 0.0))
    else:
        out["rollout_is_std"] = 0.0
    wc = np.clip(w, 0.0, upper)
    second = float(masked_mean((wc / (masked_mean(wc, m) + 1e-8)) ** 2, m))
    # verl: `1.0 / 0.0` raises ZeroDivisionError when every weight is 0; rcdiag's documented value there is NaN
    out["rollout_is_eff_sample_size"] = 1.0 / second if second else math.nan
    sw = masked_mean(w, m, axis=-1)
    out["rollout_is_seq_mean"] = float(sw.mean())
    out["rollout_is_seq_std"] = float(sw.std(ddof=1)) if sw.size > 1 else 0.0
    out["rollout_is_seq_max"] = float(sw.max())
    out["rollout_is_seq_min"] = float(sw.min())
    out["rollout_is_seq_max_deviation"] = float(np.abs(sw - 1.0).max())
    rsw = masked_mean(raw, m, axis=-1)
    out["rollout_is_seq_fraction_high"] = float(np.mean(rsw > upper))
    out["rollout_is_seq_fraction_low"] = float(np.mean(rsw < lo))
    if lower is not None:
        out["rollout_is_oob_ratio"] = float(masked_mean(((raw < lower) | (raw > upper)).astype(float), m))
    if batch_normalize:
        if level == "token":
            factor = float(masked_mean(w, m))
        else:
            rows = m.sum(-1) > 0
            factor = float((sw * rows).sum() / max(rows.sum(), 1e-8))
        out["rollout_is_batch_norm_factor"] = factor if factor > 1e-8 else 1.0
    return out


def _verl_rs(log_ratio, m, rollout_rs, rs_threshold):
    options = list(dict.fromkeys(o.strip() for o in rollout_rs.split(",") if o.strip()))
    specs = [s.strip() for s in str(rs_threshold).split(",")]
    specs = specs * len(options) if len(specs) == 1 else specs
    lr = np.clip(log_ratio, -CLAMP, CLAMP)
    stats = {"k1": -lr, "k2": 0.5 * lr**2, "k3": np.exp(lr) - 1.0 - lr}
    valid = m > 0
    seq_valid = m.sum(-1) > 0
    combined = np.ones_like(m)
    out = {}
    for option, spec in zip(options, specs, strict=True):
        stat_name = option[-2:]
        k1 = stat_name == "k1"
        if k1:
            lower, upper = (float(x) for x in spec.split("_")) if "_" in spec else (
                float(str(1.0 / float(spec))), float(spec))
            thr, thr_lo = math.log(upper), math.log(lower)
        else:
            assert "_" not in spec
            thr, thr_lo = float(spec), 0.0
        token_stat = stats[stat_name]
        if option.startswith("token"):
            per_token, per_seq = token_stat, None
            keep = (token_stat >= thr_lo) & (token_stat <= thr) if k1 else token_stat <= thr
        else:
            if option.startswith("seq_sum"):
                per_seq = masked_sum(token_stat, m, axis=-1)
            elif option.startswith("seq_mean"):
                per_seq = masked_mean(token_stat, m, axis=-1)
            else:
                top = np.where(valid, token_stat, -np.inf).max(-1)
                per_seq = np.where(top == -np.inf, 0.0, top)
            seq_keep = (per_seq >= thr_lo) & (per_seq <= thr) if k1 else per_seq <= thr
            keep = np.broadcast_to(seq_keep[:, None], m.shape)
            per_token = np.broadcast_to(per_seq[:, None], m.shape)
        keep = keep.astype(float)
        combined = combined * keep
        out.update(_verl_rs_metrics(option, per_token, per_seq, m, seq_valid, thr, thr_lo, k1))
        out[f"rollout_rs_{option}_masked_fraction"] = float(masked_mean(1 - keep, m))
        seq_kept = ~(((keep == 0) & valid).any(-1))
        out[f"rollout_rs_{option}_seq_masked_fraction"] = (
            float(((~seq_kept) & seq_valid).sum() / seq_valid.sum()) if seq_valid.sum() else 0.0)
    out["rollout_rs_masked_fraction"] = float(masked_mean(1 - combined, m))
    out["rollout_rs_seq_masked_fraction"] = float((((combined <= 0.5) & valid).any(-1)).mean())
    return out


def _verl_rs_metrics(option, stat, per_seq, m, seq_valid, thr, thr_lo, k1):
    p = f"rollout_rs_{option}"
    valid = m > 0
    seq_values = per_seq if per_seq is not None else masked_mean(stat, m, axis=-1)
    v = seq_values[seq_valid]
    out = {f"{p}_mean": float(masked_mean(stat, m))}
    if per_seq is not None and v.size:
        out[f"{p}_max"], out[f"{p}_min"] = float(v.max()), float(v.min())
        out[f"{p}_fraction_high"] = float(np.mean(v > thr))
        out[f"{p}_fraction_low"] = float(np.mean(v < thr_lo)) if k1 else 0.0
    else:
        out[f"{p}_max"], out[f"{p}_min"] = float(stat[valid].max()), float(stat[valid].min())
        out[f"{p}_fraction_high"] = float(masked_mean((stat > thr).astype(float), m))
        out[f"{p}_fraction_low"] = float(masked_mean((stat < thr_lo).astype(float), m)) if k1 else 0.0
    if m.sum() > 1:
        sc = np.clip(stat, thr_lo if k1 else 0.0, thr)
        out[f"{p}_std"] = math.sqrt(max(float(masked_mean(sc**2, m) - masked_mean(sc, m) ** 2), 0.0))
    else:
        out[f"{p}_std"] = 0.0
    out[f"{p}_seq_mean"] = float(v.mean())
    out[f"{p}_seq_std"] = float(v.std(ddof=1)) if v.size > 1 else 0.0
    out[f"{p}_seq_max"], out[f"{p}_seq_min"] = float(v.max()), float(v.min())
    out[f"{p}_seq_max_deviation"] = float(np.abs(v).max())
    out[f"{p}_seq_fraction_high"] = float(np.mean(v > thr))
    if k1:
        out[f"{p}_seq_fraction_low"] = float(np.mean(v < thr_lo))
    return out


def _verl_offpolicy(a, b, m):
    ma, mb = masked_mean(a, m, axis=-1), masked_mean(b, m, axis=-1)
    lr = a - b
    diff = mb - ma
    s = masked_sum(lr, m, axis=-1)
    return {
        "training_ppl": float(np.exp(-ma).mean()), "training_log_ppl": float((-ma).mean()),
        "kl": float(masked_mean(b - a, m)), "k3_kl": float(masked_mean(np.expm1(lr) - lr, m)),
        "rollout_ppl": float(np.exp(-mb).mean()), "rollout_log_ppl": float((-mb).mean()),
        "log_ppl_diff": float(diff.mean()), "log_ppl_abs_diff": float(np.abs(diff).mean()),
        "log_ppl_diff_max": float(diff.max()), "log_ppl_diff_min": float(diff.min()),
        "ppl_ratio": float(np.exp(diff).mean()),
        "chi2_token": float(masked_mean(np.exp(np.clip(lr, -CLAMP, CLAMP)) ** 2, m) - 1.0),
        "chi2_seq": float(np.exp(2.0 * np.clip(s, -CLAMP, CLAMP)).mean() - 1.0),
    }


# ------------------------------------------------------------------------------------------------ TRL
def trl(a, b, m, mode="sequence_mask", clip_max=3.0, clip_min=None):
    """The five `sampling/` keys TRL logs for one generation call on one rank."""
    valid = m > 0
    d = np.where(valid, a - b, 0.0)
    with np.errstate(over="ignore"):
        r = np.exp(d) if mode.startswith("token") else np.exp(d.sum(-1, keepdims=True))
    lo = -np.inf if clip_min is None else clip_min
    hi = np.inf if clip_max is None else clip_max
    if mode.endswith("truncate"):
        r = np.clip(r, lo, hi)
    else:
        r = np.where((r < lo) | (r > hi), 0.0, r)
    delta = np.abs(a - b)[valid]
    flat = r.flatten() if mode.startswith("sequence") else r[valid]
    return {
        "sampling/sampling_logp_difference/mean": float(delta.mean()) if delta.size else 0.0,
        "sampling/sampling_logp_difference/max": float(delta.max()) if delta.size else 0.0,
        "sampling/importance_sampling_ratio/min": float(flat.min()) if flat.size else 0.0,
        "sampling/importance_sampling_ratio/mean": float(flat.mean()) if flat.size else 0.0,
        "sampling/importance_sampling_ratio/max": float(flat.max()) if flat.size else 0.0,
    }


# ------------------------------------------------------------------------------------------------ ms-swift
def swift(a, b, m, mode=None, threshold=2.0):
    """The `rollout_correction/` keys ms-swift logs for one micro-batch."""
    valid = m > 0
    t = m.sum(-1)

    def mm(x, mask=m):
        return float(np.where(mask > 0, x, 0.0).sum() / max(mask.sum(), 1.0))

    def row_mean(x):
        return np.where(valid, x, 0.0).sum(-1) / np.maximum(t, 1.0)

    lr = np.where(valid, a - b, 0.0)
    ma, mb = row_mean(a), row_mean(b)
    lrh = np.clip(lr, -CLAMP, CLAMP)
    out = {
        "training_ppl": float(np.exp(-ma).mean()), "training_log_ppl": float((-ma).mean()),
        "kl": mm(-lr), "k3_kl": mm(np.clip(np.expm1(lrh) - lrh, -10.0, 10.0)),
        "rollout_ppl": float(np.exp(-mb).mean()), "rollout_log_ppl": float((-mb).mean()),
        "log_ppl_diff": float((mb - ma).mean()), "log_ppl_abs_diff": float(np.abs(mb - ma).mean()),
        "log_ppl_diff_max": float((mb - ma).max()), "log_ppl_diff_min": float((mb - ma).min()),
        "ppl_ratio": float(np.exp(mb - ma).mean()), "chi2_token": mm(np.exp(lrh) ** 2) - 1.0,
        "chi2_seq": float(np.exp(2.0 * np.clip(row_mean(lr), -CLAMP, CLAMP)).mean() - 1.0),
    }
    if mode is not None:
        rho = np.exp(np.clip(a - b, -CLAMP, CLAMP))
        seq_ratio = np.exp(np.where(valid, np.log(np.maximum(rho, 1e-10)), 0.0).sum(-1) / np.maximum(t, 1.0))
        c = threshold
        if mode == "token_truncate":
            w = np.minimum(rho, c)
        elif mode == "token_mask":
            w = np.where(rho <= c, rho, 0.0)
        elif mode == "sequence_truncate":
            w = np.broadcast_to(np.minimum(seq_ratio, c)[:, None], m.shape)
        else:
            w = rho * (seq_ratio <= c)[:, None]
        out["is_weight_mean"] = mm(w)
        wc = np.clip(w, 1.0 / c, c)
        out["ess"] = 1.0 / max(mm((wc / (mm(wc) + 1e-8)) ** 2), 1e-10)
        if mode == "token_truncate":
            out["clipped_frac"] = mm((rho > c).astype(float))
        elif mode == "token_mask":
            out["clipped_frac"] = mm((w == 0).astype(float))
        else:
            out["clipped_frac"] = float(np.mean(seq_ratio > c))
    return {f"rollout_correction/{k}": v for k, v in out.items()}
