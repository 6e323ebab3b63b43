"""Exact full-distribution divergences (rcdiag.analysis.distributions.divergence) against an independent float64 reference
written here (plain Python loops over the vocabulary), on true log-softmax rows of perturbed logits."""
from __future__ import annotations

import math

import numpy as np
import pytest

from rcdiag.analysis.distributions.divergence import (
    exact_divergences,
    kept_mask,
    sampled_estimators,
    summarize,
)


def log_softmax(z: np.ndarray) -> np.ndarray:
    z = np.asarray(z, np.float64)
    m = z.max(axis=-1, keepdims=True)
    return z - m - np.log(np.exp(z - m).sum(axis=-1, keepdims=True))


def peaked_logits(rng: np.random.Generator, n: int, vocab: int, scale: float = 4.0) -> np.ndarray:
    """Logits like a trained policy's: a heavy-tailed spread, so rows range from near-certain to open."""
    return rng.standard_t(3, size=(n, vocab)) * scale * rng.uniform(0.3, 1.5, size=(n, 1))


def bf16(x: np.ndarray) -> np.ndarray:
    """Round to bfloat16 (8 mantissa bits), as a bf16 engine stores its activations."""
    bits = np.asarray(x, np.float32).view(np.uint32).astype(np.uint64)
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) << 16
    return rounded.astype(np.uint32).view(np.float32).astype(np.float64)


def reference_row(lmu: list[float], lpi: list[float]) -> dict[str, float]:
    mu, pi = [math.exp(v) for v in lmu], [math.exp(v) for v in lpi]
    kl = sum(m * (a - b) for m, a, b in zip(mu, lmu, lpi, strict=True) if m > 0)
    rkl = sum(p * (b - a) for p, a, b in zip(pi, lmu, lpi, strict=True) if p > 0)
    tv = 0.5 * sum(abs(m - p) for m, p in zip(mu, pi, strict=True))
    js = 0.0
    for m, p in zip(mu, pi, strict=True):
        mid = 0.5 * (m + p)
        js += 0.5 * (m * math.log(m / mid) if m > 0 else 0.0) + 0.5 * (p * math.log(p / mid) if p > 0 else 0.0)
    return {"kl_mu_pi": kl, "kl_pi_mu": rkl, "tv": tv, "js": js}


def test_matches_the_loop_reference_on_bf16_perturbed_logits() -> None:
    """Each divergence against the definition, term by term (a wrong orientation or a missing ½ fails here)."""
    rng = np.random.default_rng(3)
    z = peaked_logits(rng, 6, 300)
    lpi, lmu = log_softmax(z), log_softmax(bf16(z * 1.7) / 1.7)
    got = exact_divergences(lmu, lpi)
    for i in range(6):
        want = reference_row(lmu[i].tolist(), lpi[i].tolist())
        for name, value in want.items():
            assert got[name][i] == pytest.approx(value, rel=1e-9, abs=1e-15), (name, i)


def test_identical_fp32_sides_give_zero() -> None:
    """Identical engine and trainer: every divergence ~0 (< 1e-6), overlaps 1, masses equal."""
    z = peaked_logits(np.random.default_rng(0), 32, 2048)
    logp = log_softmax(z).astype(np.float32)
    got = exact_divergences(logp, logp.copy(), top_p=0.9)
    for name in ("kl_mu_pi", "kl_pi_mu", "tv", "js"):
        assert np.abs(got[name]).max() < 1e-6, name
    assert (got["top1_overlap"] == 1).all() and (got["top20_overlap"] == 1).all()
    np.testing.assert_allclose(got["kept_mass_mu"], got["kept_mass_pi"], atol=1e-12)


def test_bf16_engine_bounds() -> None:
    """A bf16 engine against an fp32 trainer: KL > 0 both ways, TV ≤ 1, 0 ≤ JS ≤ ln 2 — also on adversarial rows
    (disjoint supports, one-hot rows) where JS reaches ln 2 and TV reaches 1."""
    rng = np.random.default_rng(1)
    z = peaked_logits(rng, 64, 2048)
    lpi, lmu = log_softmax(z), log_softmax(bf16(z * 3.1) / 3.1)
    got = exact_divergences(lmu, lpi)
    assert (got["kl_mu_pi"] >= 0).all() and (got["kl_pi_mu"] >= 0).all()
    open_rows = np.exp(lpi).max(axis=1) < 0.99  # a near-certain row can round to the same point mass: KL 0
    assert open_rows.sum() > 10 and (got["kl_mu_pi"][open_rows] > 0).all() and (got["kl_pi_mu"][open_rows] > 0).all()
    assert (got["tv"] <= 1).all() and (got["js"] >= 0).all() and (got["js"] <= math.log(2) + 1e-12).all()
    disjoint_mu = np.full((1, 4), -np.inf)
    disjoint_mu[0, :2] = np.log(0.5)
    disjoint_pi = np.full((1, 4), -np.inf)
    disjoint_pi[0, 2:] = np.log(0.5)
    far = exact_divergences(disjoint_mu, disjoint_pi)
    assert far["tv"][0] == pytest.approx(1.0) and far["js"][0] == pytest.approx(math.log(2))
    assert math.isinf(far["kl_mu_pi"][0])


def test_monte_carlo_mean_of_sampled_k3_converges_to_the_exact_kl() -> None:
    """k3 at tokens drawn from μ is an unbiased estimate of KL(μ‖π): over many draws its mean must approach the
    exact value (within 4 standard errors), and so must k1's."""
    rng = np.random.default_rng(5)
    z = peaked_logits(rng, 1, 512, scale=2.0)
    lpi = log_softmax(z)[0]
    lmu = log_softmax(z + rng.normal(0, 0.3, size=z.shape))[0]
    exact = exact_divergences(lmu[None], lpi[None])["kl_mu_pi"][0]
    draws = rng.choice(lmu.size, size=400_000, p=np.exp(lmu) / np.exp(lmu).sum())
    est = sampled_estimators(lmu[draws], lpi[draws])
    for name in ("k3", "k1"):
        mean, se = est[name].mean(), est[name].std() / math.sqrt(draws.size)
        assert abs(mean - exact) < 4 * se, (name, mean, exact, se)
    assert (est["k3"] >= 0).all()


def test_kept_mask_follows_vllms_top_k_then_top_p() -> None:
    """vLLM's truncation: top-k first, then the smallest prefix of the renormalised top-k whose mass reaches p."""
    row = np.log(np.array([[0.5, 0.2, 0.15, 0.1, 0.05]]))
    assert kept_mask(row, 0.6).tolist() == [[True, True, False, False, False]]     # 0.5 < 0.6 ≤ 0.7
    assert kept_mask(row, 0.45).tolist() == [[True, False, False, False, False]]   # 0.5 reaches 0.45
    assert kept_mask(row, 1.0, 3).tolist() == [[True, True, True, False, False]]
    # top-k 2 → (0.714, 0.286); top-p 0.7 keeps the first only
    assert kept_mask(row, 0.7, 2).tolist() == [[True, False, False, False, False]]
    assert kept_mask(row[:, ::-1], 0.6).tolist() == [[False, False, False, True, True]]
    assert kept_mask(row).all()


def reference_kept(row: np.ndarray, top_p: float, top_k: int | None) -> set[int]:
    """vLLM's kept set of one row by its definition, in plain Python: sort by (−logp, id), cut to top-k,
    renormalise, keep each token whose predecessors' mass is below p (the first always)."""
    order = sorted(range(len(row)), key=lambda i: (-row[i], i))
    if top_k:
        order = order[:top_k]
    probs = [math.exp(row[i] - row[order[0]]) for i in order]
    total = math.fsum(probs)
    kept, before = [], 0.0
    for i, p in zip(order, probs, strict=True):
        if kept and top_p < 1.0 and before >= top_p:  # top-p 1 is off (vLLM skips it)
            break
        kept.append(i)
        before += p / total
    return set(kept)


@pytest.mark.parametrize("vocab", [7, 300, 5000])
def test_kept_set_matches_the_definition_on_ties_and_flat_rows(vocab: int) -> None:
    """Guards the candidate search (the kept set from a row's m largest entries, m grown ×4, a full sort past
    1,024): on peaked rows, flat rows (nuclei of thousands of tokens), rows whose values tie in blocks (logits
    rounded to bf16: ties across the m-th entry) and every top-k/top-p mix, the kept set is the definition's;
    the top-20 ids are the stable descending sort's."""
    from rcdiag.analysis.distributions.divergence import _top_ids

    rng = np.random.default_rng(vocab)
    rows = [log_softmax(peaked_logits(rng, 6, vocab)), log_softmax(rng.normal(0, 0.05, (3, vocab))),
            log_softmax(bf16(peaked_logits(rng, 6, vocab, scale=0.5)).round(1)), np.full((1, vocab), -math.log(vocab))]
    for logp in rows:
        ties = logp.round(12)  # exact ties stay ties; the reference and the kernel see the same doubles
        for top_p, top_k in [(0.9, None), (0.5, None), (0.999, None), (1.0, 5), (0.8, 20), (0.3, 3)]:
            keep = kept_mask(ties, top_p, top_k)
            for r, row in enumerate(ties):
                want = reference_kept(row.tolist(), top_p, top_k)
                assert set(np.flatnonzero(keep[r]).tolist()) == want, (vocab, top_p, top_k, r)
                assert kept_mask(ties[r:r + 1], top_p, top_k)[0].sum() == len(want)
        k = min(20, vocab)
        want = [sorted(range(vocab), key=lambda i, row=row: (-row[i], i))[:k] for row in ties]
        assert _top_ids(ties, 20).tolist() == want


def test_top_p_kept_mass_equals_the_offset_check(tmp_path) -> None:
    """At top-p 0.9 a processed log-prob is log μ(x) − log S; with an exact trainer the per-token offset b − a is
    −log S, and the truncation check infers kept mass S ≈ exp(−mean offset). The exact geometric-mean kept mass
    must equal that estimate (to 1e-6) on the same sampled positions."""
    import pandas as pd

    from rcdiag.checks.verdicts import run_checks
    from rcdiag.store.writer import write_run

    rng = np.random.default_rng(11)
    n, vocab = 600, 256
    logp = log_softmax(peaked_logits(rng, n, vocab, scale=2.5))
    exact = exact_divergences(logp, logp, top_p=0.9)
    keep = kept_mask(logp, 0.9)
    tokens = np.array([rng.choice(vocab, p=np.where(k, np.exp(r), 0) / np.where(k, np.exp(r), 0).sum())
                       for r, k in zip(logp, keep, strict=True)])
    a = logp[np.arange(n), tokens]
    b = a - np.log(exact["kept_mass_mu"])
    seq = np.repeat(np.arange(n // 20), 20)
    frame = pd.DataFrame({"seq_id": seq, "pos": np.tile(np.arange(20), n // 20), "token_id": tokens,
                          "rollout_logprob": b.astype(np.float32), "train_logprob": a.astype(np.float32),
                          "mask": True})
    run = write_run(tmp_path / "run", frame, manifest={"engine": {"top_p": 0.9, "temperature": 1.0}})
    finding = next(f for f in run_checks(run) if f.name == "truncation_offset")
    implied = finding.evidence["implied_kept_mass"]
    # the check averages the offset over tokens with b − a > 1e-6 (a near-certain row keeps S ≈ 1, no offset),
    # the one-token supports (processed log-prob exactly 0.0, S = exp(a)) included
    a32, b32 = (frame[c].to_numpy(np.float64) for c in ("train_logprob", "rollout_logprob"))
    seen = (b32 - a32 > 1e-6) & (a32 < 0) & (b32 <= 0)
    assert 0.5 < seen.mean() < 1 and (seen & (b32 == 0)).any()
    assert summarize({"kept_mass_mu": exact["kept_mass_mu"][seen]})["geo_kept_mass_mu"] == pytest.approx(
        implied, abs=1e-6)


def test_summary_sets_k3_beside_the_exact_kl() -> None:
    """The summary's k3_minus_exact is mean k3 − mean exact KL over the same positions."""
    per = {"kl_mu_pi": np.array([0.1, 0.3]), "tv": np.array([0.2, 0.2]), "kept_mass_mu": np.array([1.0, 1.0])}
    out = summarize(per, k1=np.array([0.0, 0.2]), k3=np.array([0.5, 0.1]))
    assert out["kl_mu_pi"] == pytest.approx(0.2) and out["k3_kl"] == pytest.approx(0.3)
    assert out["k3_minus_exact"] == pytest.approx(0.1) and out["k3_over_exact"] == pytest.approx(1.5)
    assert out["positions"] == 2 and out["geo_kept_mass_mu"] == 1.0
