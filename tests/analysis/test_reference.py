"""rcdiag's metrics and IS simulations equal the independent float64 reference (tests/analysis/reference.py) on
random data for every convention × mode × threshold, with and without a lower bound."""
from __future__ import annotations

import warnings

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import rcdiag
from rcdiag.errors import ConfigError
from tests.analysis import reference as ref
from tests.analysis.helpers import CONVENTIONS, MODES, assert_close, make_tokens

DATA = st.builds(
    make_tokens,
    seed=st.integers(0, 2**32 - 1),
    n_seq=st.integers(1, 14),
    max_len=st.integers(0, 10),
    scale=st.sampled_from([1e-7, 1e-3, 0.3, 2.0]),
    mask_p=st.sampled_from([0.0, 0.2, 0.9]),
    big_p=st.sampled_from([0.0, 0.1]),
    zero_p=st.sampled_from([0.0, 0.3]),
)
SETTINGS = settings(max_examples=int(__import__("os").environ.get("RC_EXAMPLES", 40)), deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _lower_allowed(convention: str, mode: str) -> bool:
    return convention in ("canonical", "trl") or (convention == "verl" and mode.endswith("mask"))


@SETTINGS
@given(tokens=DATA, convention=st.sampled_from(CONVENTIONS))
def test_metrics_match_reference(tokens, convention):
    """Every diagnostic and count; guards: per-batch means, wrong empty-row handling, wrong clamps."""
    got = rcdiag.compute_metrics(tokens, convention)
    want = ref.metrics(ref.sequences(tokens), convention)
    assert_close(got, want, what=f"[{convention}]")
    assert list(got)[:13] == list(want)[:13]


@SETTINGS
@given(tokens=DATA, convention=st.sampled_from(CONVENTIONS), mode=st.sampled_from(MODES),
       threshold=st.sampled_from([1.0, 1.1, 1.5, 2.0, 10.0]), lower=st.sampled_from([None, 0.5, 1.0]))
def test_simulate_matches_reference(tokens, convention, mode, threshold, lower):
    """Every IS metric; guards: wrong tie rule, ESS clamp, swift/verl/trl quirks, float32 counts."""
    if lower is not None and not _lower_allowed(convention, mode):
        with pytest.raises(ConfigError):
            rcdiag.simulate(tokens, mode, threshold, lower, convention)
        return
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        got = rcdiag.simulate(tokens, mode, threshold, lower, convention)
    want = ref.is_metrics(ref.sequences(tokens), convention, mode, threshold, lower)
    assert_close(got, want, rel=1e-10, what=f"[{convention} {mode} C={threshold} L={lower}]")


@settings(max_examples=15, deadline=None)
@given(tokens=DATA, convention=st.sampled_from(CONVENTIONS))
def test_sweep_rows_equal_simulate_reference(tokens, convention):
    """One pass for all modes × thresholds gives each cell's reference (guards state shared between modes)."""
    thresholds = (1.1, 2.0, 5.0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        table = rcdiag.sweep(tokens, thresholds=thresholds, convention=convention)
    assert list(table.columns[:2]) == ["mode", "threshold"]
    assert len(table) == len(MODES) * len(thresholds)
    seqs = ref.sequences(tokens)
    for row in table.to_dict("records"):
        want = ref.is_metrics(seqs, convention, row["mode"], row["threshold"])
        assert_close(row, want, rel=1e-10, what=f"[sweep {convention} {row['mode']} C={row['threshold']}]")


@settings(max_examples=25, deadline=None)
@given(tokens=DATA, option=st.sampled_from(["token_k1", "token_k2", "token_k3", "seq_sum_k1", "seq_sum_k2",
                                            "seq_sum_k3", "seq_mean_k1", "seq_mean_k2", "seq_mean_k3",
                                            "seq_max_k2", "seq_max_k3"]),
       upper=st.sampled_from([0.01, 0.5, 2.0]), lower=st.sampled_from([None, 0.001]),
       mode=st.sampled_from(MODES), normalize=st.booleans())
def test_rejection_and_normalisation_match_reference(tokens, option, upper, lower, mode, normalize):
    """verl rejection options (chained with a token_k1 band) and batch normalisation (verl refuses a lower bound
    on k2/k3 options: so does rcdiag under verl)."""
    if option.endswith("k1"):
        upper = max(upper, 1.0) * 1.5
    elif lower is not None:
        with pytest.raises(ConfigError, match="single upper bound"):
            rcdiag.simulate(tokens, mode, 2.0, convention="verl", rejection=[(option, upper, lower)])
        lower = None
    chain = ((option, upper, lower), ("token_k1", 50.0, None))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        got = rcdiag.simulate(tokens, mode, 2.0, convention="verl", rejection=chain, batch_normalize=normalize)
    want = ref.is_metrics(ref.sequences(tokens), "verl", mode, 2.0, rejection=chain, batch_normalize=normalize)
    assert_close(got, want, rel=1e-10, what=f"[verl {mode} reject {chain} norm={normalize}]")


def test_string_rejection_equals_tuple():
    tokens = make_tokens(3, n_seq=30, scale=0.4)
    a = rcdiag.simulate(tokens, "token_mask", rejection=["token_k1:0.5_2.0", "seq_mean_k3:0.05"])
    b = rcdiag.simulate(tokens, "token_mask", rejection=[("token_k1", 2.0, 0.5), ("seq_mean_k3", 0.05)])
    assert a == b
    assert a["kept_token_frac"] < 1.0  # the options did reject something


@pytest.mark.parametrize("convention", CONVENTIONS)
@pytest.mark.parametrize("mode", MODES)
def test_returned_weights_match_reference(convention, mode):
    """return_weights: one row per token row; the applied weight on valid rows (0 where a rejection removed the
    token), NaN on masked rows; batch normalisation divides them by their token mean."""
    tokens = make_tokens(21, n_seq=25, max_len=12, scale=0.6, mask_p=0.2, big_p=0.05)
    chain = (("token_k3", 0.5, None),) if convention == "verl" else ()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        result = rcdiag.simulate(tokens, mode, 1.5, convention=convention, rejection=chain, return_weights=True,
                                 batch_normalize=True)
    frame = result["weights"]
    assert frame[["seq_id", "pos"]].to_numpy().tolist() == tokens[["seq_id", "pos"]].to_numpy().tolist()
    valid = tokens["mask"].to_numpy()
    assert frame["weight"][~valid].isna().all()
    applied: list[float] = []
    ref.is_metrics(ref.sequences(tokens), convention, mode, 1.5, rejection=chain, applied=applied)
    flags = _scored_flags(tokens, chain)
    scored = [w for w, k in zip(applied, flags, strict=True) if k]
    scale = sum(scored) / len(scored)
    if convention == "verl":  # verl v0.9.0: weights of the original mask; the factor of its own level
        scale = _verl_factor(tokens, mode, applied)
        applied = [w if k else 0.0 for w, k in zip(applied, flags, strict=True)]  # the loss mask drops them
    got = frame["weight"][valid].to_numpy()
    want = [w / scale for w in applied]
    worst = max(range(len(want)), key=lambda i: abs(got[i] - want[i]), default=None)
    assert worst is None or abs(got[worst] - want[worst]) <= 1e-12 * max(1.0, abs(want[worst])), (
        f"largest deviation at valid token {worst}: got {got[worst]!r}, reference {want[worst]!r}")
    if convention == "verl":  # verl logs the metrics before normalisation, and the factor
        assert result["batch_norm_factor"] == pytest.approx(scale, rel=1e-12)
    elif not (convention == "trl" and mode.startswith("sequence")):  # trl's mean is over sequences, not tokens
        assert result["is_weight_mean"] == pytest.approx(1.0, rel=1e-12)


def _verl_factor(tokens, mode, applied) -> float:
    """verl's batch-norm divisor: token mean of the weights (token level), or the mean over rows with tokens of
    each row's weight (sequence level: every token of a row carries the row's weight)."""
    if mode.startswith("token"):
        return sum(applied) / len(applied)
    firsts, i = [], 0
    for s in ref.sequences(tokens):
        if s.t:
            firsts.append(applied[i])
        i += s.t
    return sum(firsts) / len(firsts)


def _scored_flags(tokens, chain) -> list[bool]:
    flags = []
    for s in ref.sequences(tokens):
        keep = [True] * s.t
        for option, up, lo in chain:
            keep = [k and r for k, r in zip(keep, ref.rejection_keep(s, option, up, lo), strict=True)]
        flags.extend(keep)
    return flags
