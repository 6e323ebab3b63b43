"""rcdiag under each framework's convention and key names reproduces every number that framework logs, held
against the independent padded-matrix references of tests/analysis/frameworks.py (written from verl v0.9.0, TRL
v1.9.0 and ms-swift v4.5.2 source), on random and adversarial batches."""
from __future__ import annotations

import math
import warnings

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import rcdiag
from rcdiag.analysis.correction.rejection import verl_rejections
from rcdiag.errors import ConfigError
from tests.analysis import frameworks as fw
from tests.analysis.helpers import make_tokens

REL = 1e-6  # the references keep verl's float32 `+ 1e-8` and E[x²] − E[x]², rcdiag is exact
DATA = st.builds(make_tokens, seed=st.integers(0, 2**32 - 1), n_seq=st.integers(1, 10), max_len=st.integers(0, 8),
                 scale=st.sampled_from([1e-3, 0.3, 2.0]), mask_p=st.sampled_from([0.0, 0.3]),
                 big_p=st.sampled_from([0.0, 0.1]), zero_p=st.sampled_from([0.0, 0.3]))
SETTINGS = settings(max_examples=int(__import__("os").environ.get("RC_EXAMPLES", 40)), deadline=None,
                    suppress_health_check=[HealthCheck.too_slow])
RS_OPTIONS = ["token_k1", "token_k2", "token_k3", "seq_sum_k1", "seq_sum_k2", "seq_sum_k3", "seq_mean_k1",
              "seq_mean_k2", "seq_mean_k3", "seq_max_k2", "seq_max_k3"]


def compare(got: dict, want: dict, what: str, rel: float = REL) -> None:
    """Every key the framework logs is in rcdiag's result, under the same name, with the same value."""
    missing = sorted(set(want) - set(got))
    assert not missing, f"{what}: rcdiag lacks the framework keys {missing}"
    for key, expected in want.items():
        actual = got[key]
        if math.isinf(expected) or math.isnan(expected):
            assert actual == expected or (math.isnan(expected) and math.isnan(actual)), (what, key, actual)
            continue
        # verl's `_std` is sqrt(E[x²] − E[x]²): its cancellation leaves ~sqrt(eps)·scale of noise (float32 in
        # verl: ~3e-4), which rcdiag's exact std does not reproduce
        noise = 1e-6 if key.endswith("_std") and "_seq_std" not in key else 1e-9
        assert abs(actual - expected) <= noise + rel * abs(expected), (
            f"{what} {key}: rcdiag {actual!r}, framework {expected!r}")


def _universe(tokens, extra: int) -> list[int]:
    ids = sorted(set(tokens["seq_id"].tolist()))
    return ids + [max(ids + [0]) + 1 + k for k in range(extra)]


def run_verl(tokens, universe, level, action, upper, lower, normalize, rs, rs_thr):
    a, b, m = fw.padded(tokens, universe)
    threshold = f"{lower}_{upper}" if action == "mask" else str(upper)
    want = fw.verl(a, b, m, level, threshold, normalize, rs, rs_thr)
    sequences = pd.DataFrame({"seq_id": np.array(universe, np.int64)})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        got = rcdiag.compute_metrics(tokens, sequences=sequences, keys="verl")
        got.update(rcdiag.simulate(tokens, f"{level}_{action}", upper, lower if action == "mask" else None,
                                   sequences=sequences, keys="verl", batch_normalize=normalize,
                                   rejection=verl_rejections(rs, rs_thr) if rs else ()))
    return got, want


@SETTINGS
@given(tokens=DATA, extra=st.integers(0, 2), level=st.sampled_from(["token", "sequence"]),
       action=st.sampled_from(["truncate", "mask"]), upper=st.sampled_from([1.5, 2.0, 5.0]),
       lower=st.sampled_from([0.2, 0.5]), normalize=st.booleans(),
       rs=st.lists(st.sampled_from(RS_OPTIONS), min_size=0, max_size=3), thr=st.sampled_from([0.01, 0.3, 3.0]))
def test_verl_logs_reproduced(tokens, extra, level, action, upper, lower, normalize, rs, thr):
    """Every rollout_corr/ key: IS metrics on the original mask before normalisation, rollout_is_seq_*, oob,
    batch-norm factor at both levels, each rejection option's statistics and the chain's masked fractions, and the
    off-policy diagnostics; empty rows (extra) and all-masked rows included."""
    if not tokens["mask"].any():
        return  # verl raises ValueError on such a batch (see test_verl_no_valid_token)
    universe = _universe(tokens, extra)
    rs = list(dict.fromkeys(rs))
    rs_text = ",".join(rs) or None
    specs = ",".join(("0.5_" + str(max(thr, 1.0) * 2)) if o.endswith("k1") else str(thr) for o in rs)
    got, want = run_verl(tokens, universe, level, action, upper, lower, normalize, rs_text, specs or None)
    compare(got, want, f"[verl {level}_{action} C={upper} L={lower} norm={normalize} rs={rs_text}:{specs}]")


@SETTINGS
@given(tokens=DATA, extra=st.integers(0, 2), mode=st.sampled_from(
    ["token_truncate", "token_mask", "sequence_truncate", "sequence_mask"]),
    upper=st.sampled_from([None, 1.0, 1.5, 3.0]), lower=st.sampled_from([None, 0.25, 1.0]))
def test_trl_logs_reproduced(tokens, extra, mode, upper, lower):
    """The five sampling/ keys, with clip_max None (lower bound only), all-masked rows (ratio 1 in sequence
    modes) and batches without a valid token (0.0 / 1.0, as TRL logs)."""
    if upper is None and lower is None and mode.endswith("truncate"):
        with pytest.raises(ConfigError, match="TRL refuses"):
            rcdiag.simulate(tokens, mode, None, convention="trl")
        return
    universe = _universe(tokens, extra)
    want = fw.trl(*fw.padded(tokens, universe), mode, upper, lower)
    sequences = pd.DataFrame({"seq_id": np.array(universe, np.int64)})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        got = rcdiag.compute_metrics(tokens, sequences=sequences, keys="trl")
        got.update(rcdiag.simulate(tokens, mode, upper, lower, sequences=sequences, keys="trl"))
    compare(got, want, f"[trl {mode} clip_max={upper} clip_min={lower}]", rel=1e-12)


@SETTINGS
@given(tokens=DATA, extra=st.integers(0, 2), mode=st.sampled_from(
    [None, "token_truncate", "token_mask", "sequence_truncate", "sequence_mask"]),
    threshold=st.sampled_from([1.0, 2.0, 3.0]))
def test_swift_logs_reproduced(tokens, extra, mode, threshold):
    """The 13 off-policy keys and is_weight_mean / ess / clipped_frac for one micro-batch — also one without a
    valid token, where swift's max(N, 1) divisors log 0 / −1 / 1e10 (canonical keeps NaN: test below)."""
    universe = _universe(tokens, extra)
    if not universe:
        return  # a micro-batch has at least one row
    want = fw.swift(*fw.padded(tokens, universe), mode, threshold)
    sequences = pd.DataFrame({"seq_id": np.array(universe, np.int64)})
    got = rcdiag.compute_metrics(tokens, sequences=sequences, keys="swift")
    if mode is not None:
        got.update(rcdiag.simulate(tokens, mode, threshold, sequences=sequences, keys="swift"))
    compare(got, want, f"[swift {mode} C={threshold}]")


def _rows(rows):
    seq, pos, a, b, m = zip(*rows, strict=True)
    return pd.DataFrame({"seq_id": np.array(seq, np.int64), "pos": np.array(pos, np.int32),
                         "train_logprob": np.array(a, np.float32), "rollout_logprob": np.array(b, np.float32),
                         "mask": np.array(m, bool)})


def test_verl_adversarial_batch():
    """Hand-built: a single-token row, an all-masked row, an empty row, ties exactly at C and at L (ℓ = ±0.5 with
    C = e^0.5, L = e^-0.5: verl keeps both, counts neither high nor low), a rejection chain at both levels."""
    c = math.exp(0.5)
    low = math.exp(-0.5)
    assert math.log(c) == 0.5 and math.log(low) == -0.5  # exact ties in log space and in ratio space
    tokens = _rows([(0, 0, -1.0, -1.5, True), (0, 1, -2.0, -1.5, True), (0, 2, -3.0, -1.0, True),
                    (1, 0, -0.25, -0.75, True),
                    (2, 0, -1.0, -9.0, False), (2, 1, -4.0, -1.0, False),
                    (4, 0, -1.0, -1.0, True), (4, 1, -30.0, -1.0, True), (4, 2, -1.0, -1.25, True)])
    universe = [0, 1, 2, 3, 4]
    for level in ("token", "sequence"):
        for action in ("truncate", "mask"):
            for normalize in (False, True):
                got, want = run_verl(tokens, universe, level, action, c, low, normalize,
                                     "token_k1,seq_mean_k3,seq_max_k2", f"{low}_{c},0.5,2.0")
                compare(got, want, f"[verl adversarial {level}_{action} norm={normalize}]")
    got = rcdiag.simulate(tokens, "token_mask", c, low, keys="verl")
    # the ties ℓ = ±0.5 are kept and count neither high nor low; only ℓ = −2 and ℓ = −29 are below L
    assert got["rollout_corr/rollout_is_ratio_fraction_high"] == 0.0
    assert got["rollout_corr/rollout_is_ratio_fraction_low"] == pytest.approx(2 / 7, rel=1e-7)
    assert got["rollout_corr/rollout_is_oob_ratio"] == pytest.approx(2 / 7, rel=1e-7)


def test_verl_no_valid_token_and_all_zero_weights():
    """Where verl raises (no valid token: ValueError; IcePop with every weight 0: ZeroDivisionError in the ESS)
    rcdiag returns NaN, with a RuntimeWarning for the ESS."""
    nothing = _rows([(0, 0, -1.0, -2.0, False)])
    got = rcdiag.simulate(nothing, "token_mask", 2.0, 0.5, keys="verl", rejection=verl_rejections("token_k1", "2"))
    assert all(math.isnan(v) for v in got.values()), got
    far = _rows([(0, 0, -1.0, -5.0, True), (1, 0, -5.0, -1.0, True)])
    with pytest.warns(RuntimeWarning, match="ESS is undefined"):
        got = rcdiag.simulate(far, "token_mask", 2.0, 0.5, keys="verl")
    assert math.isnan(got["rollout_corr/rollout_is_eff_sample_size"]) and got["rollout_corr/rollout_is_mean"] == 0


def test_keys_and_convention_must_agree():
    tokens = make_tokens(1)
    with pytest.raises(ConfigError, match="keys='verl'"):
        rcdiag.compute_metrics(tokens, "swift", keys="verl")
    with pytest.raises(ConfigError, match="unknown keys"):
        rcdiag.compute_metrics(tokens, keys="wandb")
    with pytest.raises(ConfigError, match="no upper bound"):
        rcdiag.simulate(tokens, "token_mask", None)
    canonical = rcdiag.compute_metrics(tokens)
    assert rcdiag.compute_metrics(tokens, keys="canonical") == canonical
    renamed = rcdiag.compute_metrics(tokens, keys="swift")
    assert renamed["rollout_correction/kl"] == canonical["kl"] or canonical["kl"] != canonical["kl"]
    assert renamed["rcdiag/tokens"] == canonical["tokens"]


def test_verl_rejection_config_strings():
    """verl's rollout_rs / rollout_rs_threshold: duplicates dropped before counting thresholds, one shared value or
    one per option, k1 upper-only means [1/up, up], a lower bound on k2/k3 refused (verl raises ValueError)."""
    chain = verl_rejections("token_k1, seq_mean_k3, token_k1", "2.0,0.01")
    assert [(r.option, r.upper, r.lower) for r in chain] == [("token_k1", 2.0, None), ("seq_mean_k3", 0.01, None)]
    assert chain[0].bounds() == (math.log(0.5), math.log(2.0))
    assert [r.upper for r in verl_rejections("token_k3,seq_max_k2", "0.5")] == [0.5, 0.5]
    with pytest.raises(ConfigError, match="one value shared"):
        verl_rejections("token_k1,token_k2,token_k3", "1,2")
    with pytest.raises(ConfigError, match="single upper bound"):
        verl_rejections("token_k2", "0.1_0.5")


def test_no_valid_token_values_per_convention():
    """No valid token: canonical and verl NaN (verl raises; its training/ keys say valid 0), TRL 0.0 / 1.0,
    ms-swift 0 / −1 / 1e10 — each as the framework logs it, checked against the references."""
    nothing = _rows([(0, 0, -1.0, -2.0, False), (1, 0, -3.0, -1.0, False)])
    universe = [0, 1, 2]
    sequences = pd.DataFrame({"seq_id": np.array(universe, np.int64)})
    canonical = rcdiag.compute_metrics(nothing, sequences=sequences)
    assert all(math.isnan(canonical[k]) for k in rcdiag.analysis.METRIC_NAMES)
    assert math.isnan(rcdiag.simulate(nothing, "token_truncate", 2.0, sequences=sequences)["is_weight_mean"])
    for mode in ("token_truncate", "token_mask", "sequence_truncate", "sequence_mask"):
        want = fw.swift(*fw.padded(nothing, universe), mode, 2.0)
        got = rcdiag.compute_metrics(nothing, sequences=sequences, keys="swift")
        got.update(rcdiag.simulate(nothing, mode, 2.0, sequences=sequences, keys="swift"))
        compare(got, want, f"[swift no valid token {mode}]")
        assert got["rollout_correction/chi2_token"] == -1.0 and got["rollout_correction/ess"] == 1e10
    verl = rcdiag.compute_metrics(nothing, sequences=sequences, keys="verl")
    compare(verl, fw.verl_debug(*fw.padded(nothing, universe)), "[verl debug, no valid token]")
    assert verl["training/rollout_probs_diff_valid"] == 0 and math.isnan(verl["rollout_corr/kl"])


def test_trl_and_swift_adversarial_batch():
    """Hand-built, against the TRL and ms-swift references: a single-token row, an all-masked row, an empty row,
    ℓ = ±0.5 exactly at C = e^0.5 and L = e^-0.5 (ties kept: ρ ≤ C, ρ ≥ L), a sequence whose ratio ties C, an
    exact-zero ℓ and a catastrophic ℓ = −29 (beyond the ±20 clamp swift applies and TRL does not)."""
    c, low = math.exp(0.5), math.exp(-0.5)
    assert np.exp(0.5) == c and np.exp(-0.5) == low
    tokens = _rows([(0, 0, -1.0, -1.5, True), (0, 1, -2.0, -1.5, True), (0, 2, -3.0, -1.0, True),
                    (1, 0, -0.25, -0.75, True),
                    (2, 0, -1.0, -9.0, False), (2, 1, -4.0, -1.0, False),
                    (4, 0, -1.0, -1.0, True), (4, 1, -30.0, -1.0, True)])
    universe = [0, 1, 2, 3, 4]
    sequences = pd.DataFrame({"seq_id": np.array(universe, np.int64)})
    a, b, m = fw.padded(tokens, universe)
    for mode in ("token_truncate", "token_mask", "sequence_truncate", "sequence_mask"):
        for upper, lower in ((c, low), (None, low), (c, None)):
            got = rcdiag.compute_metrics(tokens, sequences=sequences, keys="trl")
            got.update(rcdiag.simulate(tokens, mode, upper, lower, sequences=sequences, keys="trl"))
            compare(got, fw.trl(a, b, m, mode, upper, lower), f"[trl adversarial {mode} {upper} {lower}]",
                    rel=1e-12)
        got = rcdiag.compute_metrics(tokens, sequences=sequences, keys="swift")
        got.update(rcdiag.simulate(tokens, mode, c, sequences=sequences, keys="swift"))
        compare(got, fw.swift(a, b, m, mode, c), f"[swift adversarial {mode}]")
    # the ties are kept: under token_mask only ℓ = −2 and ℓ = −29 fall outside [L, C]
    kept = rcdiag.simulate(tokens, "token_mask", c, low, keys="trl")
    assert kept["sampling/importance_sampling_ratio/max"] == c
    assert kept["sampling/importance_sampling_ratio/min"] == 0.0
