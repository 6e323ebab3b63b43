"""The gate families and each framework's logged numbers of them, against the independent padded-matrix
references of tests/analysis/gate_reference.py (written from verl @ 1dda039, prime-rl @ 559b447, openrlhf 0.11.2,
SkyRL @ a956457, ROLL @ 8eb27cc, NeMo-RL @ 7ea279a), on random batches and on hand-built cases with known
answers."""
from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from hypothesis import given
from hypothesis import strategies as st

import rcdiag
from rcdiag.analysis.correction.gates import gate_sweep, simulate_gate
from rcdiag.errors import ConfigError
from tests.analysis import frameworks as fw
from tests.analysis import gate_reference as ref
from tests.analysis.helpers import make_tokens
from tests.analysis.test_frameworks import SETTINGS, compare

DATA = st.builds(make_tokens, seed=st.integers(0, 2**32 - 1), n_seq=st.integers(1, 10), max_len=st.integers(1, 8),
                 scale=st.sampled_from([0.05, 0.5, 2.0]), mask_p=st.sampled_from([0.0, 0.3]),
                 big_p=st.sampled_from([0.0, 0.1]), zero_p=st.sampled_from([0.0, 0.3]))


def _with_advantages(tokens, seed):
    """Per-sequence advantages of both signs and zero, as a sequences frame."""
    ids = sorted(set(tokens["seq_id"].tolist()))
    rng = np.random.default_rng(seed)
    adv = rng.choice([-1.5, 0.0, 0.7], size=len(ids))
    return pd.DataFrame({"seq_id": np.array(ids, np.int64), "advantage": adv})


def _adv_matrix(tokens, advantages):
    ids = sorted(set(tokens["seq_id"].tolist()))
    lookup = dict(zip(advantages["seq_id"], advantages["advantage"], strict=True))
    width = fw.padded(tokens)[0].shape[1]
    return np.array([[lookup[s]] * width for s in ids])


@SETTINGS
@given(tokens=DATA, seed=st.integers(0, 99), delta=st.sampled_from([0.05, 0.2, 0.5]), low=st.sampled_from([None, 0.1]))
def test_dppo_tv_and_prime_default(tokens, seed, delta, low):
    """verl dppo_tv's mask (A > 0 high side, A ≤ 0 low side) and prime-rl's per-sample is_masked* means: guards
    a sign rule that treats A = 0 as positive, a per-token instead of per-sample mean, or masked rows counted."""
    if not tokens["mask"].any():
        return
    advantages = _with_advantages(tokens, seed)
    a, b, m = fw.padded(tokens)
    adv = _adv_matrix(tokens, advantages)
    lo = delta if low is None else low
    valid = ref.dppo_tv_valid(np.exp(a), np.exp(b), adv, delta, lo) | (m == 0)
    got = simulate_gate(tokens, "dppo_tv", delta, low, advantages=advantages, keys="verl")
    masked = float((~valid)[m > 0].mean())
    assert got["actor/pg_clipfrac"] == pytest.approx(masked, abs=1e-12)
    assert got["rcdiag/kept_token_frac"] == pytest.approx(1 - masked, abs=1e-12)
    pos = (adv > 0) & (m > 0)
    if pos.any():
        assert got["rcdiag/kept_pos_frac"] == pytest.approx(float(valid[pos].mean()), abs=1e-12)
    prime = simulate_gate(tokens, "dppo_tv", delta, low, advantages=advantages, keys="prime-rl")
    compare(prime, ref.prime(a, b, m, adv, "default", delta, lo), "prime default", rel=1e-9)


@SETTINGS
@given(tokens=DATA, seed=st.integers(0, 99), delta=st.sampled_from([0.01, 0.05, 0.2]))
def test_dppo_kl(tokens, seed, delta):
    """verl dppo_kl: the binary KL bound binds only where the probability moved with the advantage."""
    if not tokens["mask"].any():
        return
    advantages = _with_advantages(tokens, seed)
    a, b, m = fw.padded(tokens)
    valid = ref.dppo_kl_valid(a, b, _adv_matrix(tokens, advantages), delta, delta) | (m == 0)
    got = simulate_gate(tokens, "dppo_kl", delta, advantages=advantages, keys="verl")
    assert got["actor/pg_clipfrac"] == pytest.approx(float((~valid)[m > 0].mean()), abs=1e-12)


@SETTINGS
@given(tokens=DATA, gate=st.sampled_from(["token_tv", "seq_tv", "token_binary_kl", "seq_binary_kl",
                                          "openrlhf_token_ratio", "openrlhf_seq_ratio"]),
       delta=st.sampled_from([0.01, 0.1, 0.3]), extra=st.integers(0, 2))
def test_openrlhf_gating(tokens, gate, delta, extra):
    """OpenRLHF is_filter_ratio (tokens at token level, ALL rows at seq level — a row without a valid token is
    filtered) and vllm_kl."""
    if not tokens["mask"].any():
        return
    ids = sorted(set(tokens["seq_id"].tolist()))
    universe = ids + [max(ids) + 1 + k for k in range(extra)]
    a, b, m = fw.padded(tokens, universe)
    gating = "ratio" if "ratio" in gate else ("tv" if "tv" in gate else "binary_kl")
    level = "seq" if gate.startswith(("seq", "openrlhf_seq")) else "token"
    high = 1 + 10 * delta if gating == "ratio" else delta
    low = 0.5 if gating == "ratio" else 0.0
    _, want_ratio, want_kl = ref.openrlhf(a, b, m, gating, level, low if gating == "ratio" else -np.inf, high)
    got = simulate_gate(tokens, gate, high, sequences=pd.DataFrame({"seq_id": np.array(universe, np.int64)}),
                        keys="openrlhf")
    assert got["train/is_filter_ratio"] == pytest.approx(want_ratio, abs=1e-12)
    assert got["train/vllm_kl"] == pytest.approx(want_kl, rel=1e-9, abs=1e-12)


@SETTINGS
@given(tokens=DATA, kind=st.sampled_from(["outlier", "token", "geo", "product"]), extra=st.integers(0, 2),
       delta=st.sampled_from([0.01, 0.3, 3.0]))
def test_skyrl_masks(tokens, kind, extra, delta):
    """SkyRL's is_ratio_* over the padded micro-batch (zeros enter std and min) and every mask ratio over all
    B rows."""
    if not tokens["mask"].any():
        return
    ids = sorted(set(tokens["seq_id"].tolist()))
    universe = ids + [max(ids) + 1 + k for k in range(extra)]
    a, b, m = fw.padded(tokens, universe)
    gate = {"outlier": "skyrl_outlier", "token": "skyrl_token_mask", "geo": "skyrl_geo_mask",
            "product": "skyrl_product_mask"}[kind]
    threshold = {"outlier": 1 + 30 * delta, "token": 1 + delta, "geo": min(delta, 0.9), "product": 1 + delta}[kind]
    lower = 1e-4 if kind == "outlier" else None
    setting = rcdiag.analysis.correction.gates.GateSetting.make(gate, threshold, lower)
    want, keep = ref.skyrl(a, b, m, kind, setting.lo, setting.hi)
    got = simulate_gate(tokens, gate, threshold, lower, sequences=pd.DataFrame({"seq_id": np.array(universe,
                                                                                                   np.int64)}),
                        keys="skyrl")
    compare(got, {f"policy/loss_metrics/{k}": v for k, v in want.items()}, f"skyrl {kind}", rel=1e-9)
    assert got["rcdiag/kept_token_frac"] == pytest.approx(float(keep[m > 0].mean()), abs=1e-12)


@SETTINGS
@given(tokens=DATA, agg=st.sampled_from(["token", "geometric", "sequence", "segment"]),
       kind=st.sampled_from(["ratio", "diff"]), delta=st.sampled_from([0.05, 0.2]))
def test_roll_filters(tokens, agg, kind, delta):
    """ROLL's filters at each agg_type (segment = runs of the mask) keep what its band keeps, and its
    always-logged train_infer_*_mean@sum values."""
    if not tokens["mask"].any():
        return
    a, b, m = fw.padded(tokens)
    v = ref.roll_stat(a, b, m, agg, kind)
    lo, hi = (1 - delta, 1 + delta) if kind == "ratio" else (-delta, delta)
    keep = (v >= lo) & (v <= hi) & (m > 0)
    got = simulate_gate(tokens, f"roll_{agg}_{kind}", delta, keys="roll")
    assert got["actor/train_infer_final_mask_mean"] == pytest.approx(float(keep[m > 0].mean()), abs=1e-12)
    compare(rcdiag.compute_metrics(tokens, keys="roll"), ref.roll_means(a, b, m), "roll means", rel=1e-9)


@SETTINGS
@given(tokens=DATA, threshold=st.sampled_from([1.01, 1.5, 5.0]), seed=st.integers(0, 9))
def test_nemo_seq_logprob_error(tokens, threshold, seed):
    """NeMo-RL's sequence error statistics, masked count, masked_correct_pct and the loss metrics over the kept
    sequences."""
    if not tokens["mask"].any():
        return
    ids = sorted(set(tokens["seq_id"].tolist()))
    rewards = np.random.default_rng(seed).choice([0.0, 1.0], size=len(ids))
    sequences = pd.DataFrame({"seq_id": np.array(ids, np.int64), "reward": rewards})
    a, b, m = fw.padded(tokens)
    want = ref.nemo(a, b, m, rewards, threshold)
    got = simulate_gate(tokens, "nemo_seq_logprob_error", threshold, sequences=sequences, keys="nemo-rl")
    compare(got, want, "nemo", rel=1e-9)


def test_tv_known_answer():
    """p = 0.5 vs 0.75: TV 0.25 — kept at δ = 0.25, masked at 0.2499; binary KL in closed form."""
    tokens = pd.DataFrame({"seq_id": [1], "pos": [0], "rollout_logprob": [math.log(0.75)],
                           "train_logprob": [math.log(0.5)], "mask": [True]})
    assert simulate_gate(tokens, "token_tv", 0.2500001)["kept_token_frac"] == 1.0
    assert simulate_gate(tokens, "token_tv", 0.2499)["kept_token_frac"] == 0.0
    kl = 0.75 * math.log(0.75 / 0.5) + 0.25 * math.log(0.25 / 0.5)  # D_B(rollout ‖ train) = 0.1308…
    assert simulate_gate(tokens, "token_binary_kl", kl * (1 + 1e-9))["kept_token_frac"] == 1.0
    assert simulate_gate(tokens, "token_binary_kl", kl * (1 - 1e-9))["kept_token_frac"] == 0.0
    reverse = 0.5 * math.log(0.5 / 0.75) + 0.5 * math.log(0.5 / 0.25)  # KPop takes the larger direction
    assert simulate_gate(tokens, "two_sided_kl", max(kl, reverse) * (1 - 1e-9))["kept_token_frac"] == 0.0


def test_segment_split_by_mask_run():
    """A sequence [ℓ = 0.1, 0.1, masked, 0.5]: two segments, means 0.1 and 0.5 — a ±0.2 ratio band keeps the
    first segment and drops the second; a whole-sequence geometric mean (0.233) would drop all three."""
    ell = [0.1, 0.1, 0.0, 0.5]
    tokens = pd.DataFrame({"seq_id": [7] * 4, "pos": [0, 1, 2, 3], "rollout_logprob": [-1.0] * 4,
                           "train_logprob": [-1.0 + x for x in ell], "mask": [True, True, False, True]})
    band = math.log(1.2) + 1e-12  # exp(0.1) = 1.105 in [0.8, 1.2]; exp(0.5) = 1.65 outside
    assert band > 0.1
    assert simulate_gate(tokens, "roll_segment_ratio", 0.2)["kept_token_frac"] == pytest.approx(2 / 3)
    assert simulate_gate(tokens, "roll_geometric_ratio", 0.2)["kept_token_frac"] == 0.0


def test_outlier_token_trips_skyrl():
    """One token with ρ = 150 > 100 drops its whole sequence under SkyRL's outlier mask; the other is kept."""
    tokens = pd.DataFrame({"seq_id": [1, 1, 1, 2, 2], "pos": [0, 1, 2, 0, 1], "rollout_logprob": [-8.0] * 5,
                           "train_logprob": [-8.0, -8.0 + math.log(150.0), -8.0, -8.0, -8.0], "mask": [True] * 5})
    got = simulate_gate(tokens, "skyrl_outlier", keys="skyrl")
    assert got["policy/loss_metrics/outlier_seq_masked_ratio"] == 0.5
    assert got["policy/loss_metrics/outlier_seq_over_high_ratio"] == 0.5
    assert got["rcdiag/kept_token_frac"] == pytest.approx(2 / 5)


def test_nemo_docs_example():
    """NeMo-RL docs/guides/grpo.md: logp_gen −5, logp_policy −15 → gen_kl ≈ 9, policy_kl ≈ 22015. Its "js ≈ 9"
    does not follow from its own code (½·k3(a − m) + ½·k3(b − m), m = log(½e^a + ½e^b) = −5.693): 4.307, what
    ClippedPGLossFn logs; the docs dropped the ½ weights."""
    tokens = pd.DataFrame({"seq_id": [1], "pos": [0], "rollout_logprob": [-5.0], "train_logprob": [-15.0],
                           "mask": [True]})
    got = rcdiag.compute_metrics(tokens, keys="nemo-rl")
    assert got["train/gen_kl_error"] == pytest.approx(9.0, abs=0.01)
    assert got["train/policy_kl_error"] == pytest.approx(22015.0, abs=1.0)
    m = math.log(0.5 * math.exp(-15.0) + 0.5 * math.exp(-5.0))
    js = 0.5 * (math.exp(-15 - m) - (-15 - m) - 1) + 0.5 * (math.exp(-5 - m) - (-5 - m) - 1)
    assert got["train/js_divergence_error"] == pytest.approx(js, rel=1e-12) and js == pytest.approx(4.307, abs=1e-3)


def test_grpo_advantages_and_source():
    """Without an advantage column the signed gates use GRPO's r − group mean (verl compute_grpo_outcome_advantage:
    a group of one has mean 0), and say so."""
    tokens = pd.DataFrame({"seq_id": [1, 2, 3], "pos": [0, 0, 0], "rollout_logprob": [math.log(0.5)] * 3,
                           "train_logprob": [math.log(0.9)] * 3, "mask": [True] * 3})
    sequences = pd.DataFrame({"seq_id": [1, 2, 3], "prompt_id": ["a", "a", "b"], "reward": [1.0, 0.0, 1.0]})
    got = simulate_gate(tokens, "dppo_tv", 0.2, sequences=sequences)
    # seq 1: A = +0.5 (masked: p rose 0.4 > 0.2); seq 2: A = −0.5 (kept); seq 3: group of one, A = 1 (masked)
    assert got["advantage_source"] == "grpo" and got["kept_token_frac"] == pytest.approx(1 / 3)
    with pytest.raises(ConfigError, match="advantage"):
        simulate_gate(tokens, "dppo_tv", 0.2)


def test_split_invariance():
    """The same numbers however the rows are batched (streaming, mergeable state)."""
    tokens = make_tokens(3, n_seq=40, max_len=9, scale=0.4)
    sequences = _with_advantages(tokens, 1)
    one = gate_sweep(tokens, advantages=sequences)
    many = gate_sweep(tokens, advantages=sequences, batch_rows=7)
    pd.testing.assert_frame_equal(one, many, rtol=1e-12)


@pytest.mark.parametrize("bad", [True, False, np.bool_(True), "abc", "2.0x", [2.0]])
def test_thresholds_refuse_booleans_and_words(bad):
    """simulate(run, "token_truncate", threshold=True) ran as C = 1.0: refused now, like a word; the same for
    bounds of sweep, rejection options and gates."""
    tokens = make_tokens(0, n_seq=3)
    with pytest.raises(ConfigError, match="must be a number"):
        rcdiag.simulate(tokens, "token_truncate", threshold=bad)
    with pytest.raises(ConfigError, match="must be a number"):
        rcdiag.simulate(tokens, "token_truncate", 2.0, lower=bad)
    with pytest.raises(ConfigError, match="must be a number"):
        rcdiag.sweep(tokens, thresholds=[bad])
    with pytest.raises(ConfigError, match="must be a number"):
        rcdiag.simulate(tokens, "token_truncate", rejection=[("token_k3", bad)])
    with pytest.raises(ConfigError, match="must be a number"):
        rcdiag.simulate(tokens, "ipo", bad)


def test_verl_band_string_read_as_verl():
    """'1_5' was read by Python's float() as C = 15; verl reads it as IcePop's band L = 1, C = 5."""
    tokens = make_tokens(2, n_seq=20, scale=1.0)
    assert rcdiag.simulate(tokens, "token_mask", "0.5_5") == rcdiag.simulate(tokens, "token_mask", 5.0, 0.5)
    with pytest.raises(ConfigError, match="give one of them"):
        rcdiag.simulate(tokens, "token_mask", "0.5_5", lower=0.5)
    with pytest.raises(ConfigError, match="two numbers"):
        rcdiag.simulate(tokens, "token_mask", "0.5_x")


def _alone_vs_together(tokens, sequences, settings):
    """Each setting's numbers from one pass of all `settings` (gate_kernels.gate_family, settings grouped in families)
    and from a pass of that setting alone."""
    from rcdiag.analysis.correction.gates import accumulator
    from rcdiag.analysis.passes.accum import Totals
    from rcdiag.analysis.passes.engine import stream

    together = accumulator(tokens, settings, sequences=sequences)
    rows = stream(tokens, [together], sequences=sequences, batch_rows=23)
    for setting, got in zip(settings, together.finish(Totals(rows)), strict=True):
        alone = simulate_gate(tokens, setting.gate, setting.threshold, setting.lower, sequences=sequences,
                              batch_rows=23)
        for key, want in alone.items():
            if isinstance(want, str):
                assert got[key] == want
            else:
                assert got[key] == pytest.approx(want, rel=1e-12, abs=1e-15, nan_ok=True), (setting, key)


@pytest.mark.parametrize("seed", [0, 1])
def test_one_pass_of_a_family_equals_each_setting_alone(seed):
    """Every gate × a shuffled grid in one pass (the report's sweep) gives each setting's numbers alone: guards
    a bin or prefix-sum off by one in the family kernel, a grid that is not reordered before it is decided (the
    kernel needs nested settings), and a framework number mixed up between settings."""
    from rcdiag.analysis.correction.gates import GATES, GateSetting

    tokens = make_tokens(seed, n_seq=30, max_len=12, scale=0.6, mask_p=0.2)
    sequences = _with_advantages(tokens, seed)
    sequences["reward"] = np.random.default_rng(seed).choice([0.0, 1.0], len(sequences))
    rng = np.random.default_rng(seed)
    settings = [GateSetting.make(g, d) for g in GATES.values() for d in rng.permutation(sorted({*g.grid, g.default}))]
    _alone_vs_together(tokens, sequences, settings)


def test_settings_that_do_not_nest_are_split():
    """A custom lower bound can break the nesting of a gate's settings (a wider upper bound with a tighter lower
    one): such settings go to separate families, and each still gets its own numbers."""
    from rcdiag.analysis.correction.gates import GateFamily, GateSetting, GateState

    tokens = make_tokens(4, n_seq=30, max_len=12, scale=0.6)
    settings = [GateSetting.make("openrlhf_token_ratio", 5.0, 0.9), GateSetting.make("openrlhf_token_ratio", 2.0, 0.5),
                GateSetting.make("openrlhf_token_ratio", 1.5, 0.95), GateSetting.make("roll_token_ratio", 0.3, 0.95)]
    families = GateFamily.families([GateState(s) for s in settings])
    assert sorted(len(f.states) for f in families) == [1, 1, 2]
    _alone_vs_together(tokens, None, settings)


def test_report_pass_over_many_files_counts_each_file_once(tmp_path):
    """The report's pass (a file at a time, parts merged) gives every gate the numbers of one gate_sweep over the
    whole run: guards a part merged twice (report.passes.Library.merge did, so every file after the first counted
    double) and GRPO groups formed within a file (the signed DPPO gates' advantages: a prompt group split across
    files had r − the mean of its part, not of the group)."""
    from rcdiag.report.options import ReportOptions
    from rcdiag.report.passes import run_passes
    from tests.fixtures.runs import SyntheticSpec, synthetic_frames

    tokens, sequences = synthetic_frames(SyntheticSpec(noise=0.8, n_seq=60, seed=5))
    run = rcdiag.write_run(tmp_path / "run", tokens, sequences, shard_tokens=300)
    assert len(run.token_files) >= 3
    groups = [set(pd.read_parquet(f, columns=["prompt_id"])["prompt_id"]) for f in run.sequence_files]
    assert any(a & b for a, b in zip(groups, groups[1:], strict=False)), "no prompt group spans two files"
    _, library = run_passes(run, ReportOptions(replicates=10, silent=True))
    got = library.gates.frame(library.rows)
    want = gate_sweep(run)
    assert got.gate.isin(["dppo_tv", "dppo_kl"]).sum() > 10 and len(got) == len(want) > 100
    numbers = ["kept_token_frac", "kept_seq_frac", "fraction_high", "kept_pos_frac", "kept_neg_frac",
               "is_weight_mean", "is_weight_std", "ess"]
    pd.testing.assert_frame_equal(got[["gate", "threshold", *numbers]], want[["gate", "threshold", *numbers]],
                                  rtol=1e-12)


@pytest.mark.parametrize("rule", [0, 3])
@pytest.mark.parametrize("ratio_weight, detail, signed", [(True, True, True), (False, True, False),
                                                          (False, False, True), (True, False, False)])
def test_whole_sequence_path_gives_the_generic_loops_bits(rule, ratio_weight, detail, signed):
    """gate_kernels.gate_family places a gate of whole sequences once per sequence (`whole`; a band reads one value per
    sequence) and adds its rows in registers: every output must be the generic per-row loop's on the statistic
    broadcast to the rows, bit for bit (counts, per-sequence sums, moments, extrema, flags, the detail counts and
    row-value sums), with sequences kept, masked at some settings, masked at all, empty, NaN-valued, and
    advantages of every sign."""
    from rcdiag.analysis.correction import gate_kernels
    rng = np.random.default_rng(7 + rule)
    lengths = rng.integers(0, 40, 300)
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
    n = int(lengths.sum())
    mask = rng.random(n) > 0.15
    ell = rng.normal(0.0, 0.3, n)
    if rule == 3:  # any_token: the row values are the clamped ℓ; a sequence is placed by its extremes
        value = np.clip(ell + rng.normal(0, 0.5, n) * (rng.random(n) < 0.05), -2.0, 2.0)
        his, los = np.log([1.2, 1.5, 2.0, 3.0, 5.0]), np.log([0.8, 0.6, 0.5, 0.3, 0.1])
        per_seq = None
    else:  # a per-sequence statistic broadcast to its rows, a few NaN
        per_seq = rng.normal(0.0, 0.2, lengths.size)
        per_seq[rng.random(lengths.size) < 0.03] = np.nan
        value = np.repeat(per_seq, lengths)
        his, los = np.array([0.05, 0.1, 0.2, 0.3]), np.array([-0.05, -0.1, -0.2, -0.3])
    adv = rng.choice([-1.0, 0.0, 1.0, 0.5], n)
    rho = np.exp(np.clip(ell, -20, 20))
    xs = rng.normal(size=(2, n)) if detail else np.empty((0, n))
    flag = rng.random(n) < 0.3
    rest = (ell, his, los, mask, adv, signed, rho, ratio_weight, starts, xs, flag, detail)
    generic = gate_kernels.gate_family(rule, value, *rest, False)
    placed = gate_kernels.gate_family(rule, value if rule == 3 else per_seq, *rest, True)  # a band: one value a sequence
    kept = generic[0][:, 1]
    assert kept[0] < kept[-1] < generic[0][0, 0], "the grid should mask some sequences at every setting"
    for name, a, b in zip(("counts", "sums", "mean", "m2", "lo_w", "hi_w", "lower", "seq", "x_kept", "x_drop"),
                          generic, placed, strict=True):
        assert a.dtype == b.dtype and np.array_equal(a, b, equal_nan=True), name
        assert a.tobytes() == b.tobytes(), name  # bits: signed zeros and NaN payloads too


@pytest.mark.parametrize("b, ell", [(-0.01, 1e-7), (-0.01, -3e-5), (-2.5, 0.03), (-2.5, -1.0), (-15.0, 10.0),
                                    (-0.5, -120.0), (-1500.0, 1499.99)])
def test_nemo_js_divergence_is_exact_at_every_scale(b, ell):
    """NeMo-RL's js_divergence_error term ½ k3(a − m) + ½ k3(b − m), m = log(½e^a + ½e^b), against the same
    formula in 50-digit arithmetic on the stored (float32) log-probs: rcdiag computes it in closed form (log cosh
    of ℓ/2), so it holds to a few ulps where NeMo-RL's own form in float64 loses ~ε/|ℓ| (1e-9 at ℓ = 1e-7), and
    stays finite past the point where e^(ℓ/2) squared would overflow."""
    mpmath = pytest.importorskip("mpmath")
    b = np.float32(b)
    a = np.float32(b + ell)
    assert a != b
    tokens = pd.DataFrame({"seq_id": [1], "pos": [0], "rollout_logprob": [b], "train_logprob": [a], "mask": [True]})
    got = rcdiag.compute_metrics(tokens, keys="nemo-rl")["train/js_divergence_error"]
    with mpmath.workdps(50):
        x, y = mpmath.mpf(float(a)), mpmath.mpf(float(b))
        m = mpmath.log((mpmath.exp(x) + mpmath.exp(y)) / 2)
        k3 = lambda t: mpmath.exp(t) - t - 1  # noqa: E731
        want = float(k3(x - m) / 2 + k3(y - m) / 2)
    assert got == pytest.approx(want, rel=4e-16 * 8, abs=0.0)
