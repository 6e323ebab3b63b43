"""Trainer-side probe on a real transformers model: packing exactness, the bf16 gap, stored files and the budget,
each number checked against an independent float64 recomputation from the stored per-token Parquet."""
from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest

from rcdiag.probe.run import ProbeConfig, run_probe
from rcdiag.store.run import Run

PACKED_TOL = 5e-6
"""float32 alone vs float32 packed (sdpa_varlen): measured max |Δ| 3.8e-6 on the sample model (|log p| up to ~20;
2.1e-7 relative), 0.0 on the config-built model; the float32 rounding bound."""
KERNEL_REL_TOL = 4e-6
"""Other attention kernels / LM-head chunking reorder float32 sums: |Δ| ≤ KERNEL_REL_TOL · max(1, |log p|)
(measured on the sample model: eager 1.5e-5 absolute / 6.6e-7 relative, sdpa 7.6e-6, chunk 16 9.5e-6)."""


@pytest.fixture(scope="module")
def probed(probe_run: Run):
    config = ProbeConfig(sample=10, factors=("train_dtype", "packing", "packing_small", "chunk", "attention"), name="trainer",
                         threads=1)
    result = run_probe(probe_run.path, config, silent=True)
    return result, pd.read_parquet(probe_run.path / "probes" / "trainer.parquet")


def _valid(frame: pd.DataFrame, column: str) -> np.ndarray:
    return frame.loc[frame["mask"], column].to_numpy(np.float64)


def test_float32_packed_equals_alone(probed) -> None:
    """Packing must not leak attention across sequences: packed rows reproduce one-at-a-time scoring."""
    _, frame = probed
    reference = _valid(frame, "reference")
    for name in ("packed_512", "packed_4096"):
        diff = np.abs(_valid(frame, name) - reference)
        assert diff.max() <= PACKED_TOL, f"{name}: max |Δ| {diff.max():.3g} at valid token {int(diff.argmax())}"
    # bf16 packed vs bf16 alone is a real batch-composition effect (matmul blocking over more rows), measured on
    # the sample model: max 4.4e-4, mean 3.2e-6 — far below the dtype effect itself (mean 2.8e-2)
    bf16 = _valid(frame, "train_bf16")
    packing = np.abs(_valid(frame, "train_bf16_packed_4096") - bf16).mean()
    assert packing < 0.01 * np.abs(bf16 - reference).mean()
    for name in ("chunk_16", "attn_sdpa", "attn_eager"):
        rel = np.abs(_valid(frame, name) - reference) / np.maximum(1.0, np.abs(reference))
        assert rel.max() <= KERNEL_REL_TOL, f"{name}: max relative |Δ| {rel.max():.3g} at {int(rel.argmax())}"


def test_reference_matches_float64_forward(probed, probe_model) -> None:
    """The reference column equals a plain float64 transformers forward, one sequence at a time (no packing,
    no chunking), at the run's temperature."""
    import torch
    from transformers import AutoModelForCausalLM

    result, frame = probed
    model = AutoModelForCausalLM.from_pretrained(probe_model, dtype=torch.float64).eval()
    run = Run(result.summary["run"])
    prompts = run.sequences().set_index("seq_id")["prompt_token_ids"]
    worst = 0.0
    for seq_id, rows in frame.groupby("seq_id"):
        ids = list(prompts[seq_id]) + rows["token_id"].tolist()
        with torch.no_grad():
            logits = model(torch.tensor([ids])).logits[0] / result.summary["temperature"]
        logp = torch.log_softmax(logits, -1)
        start = len(prompts[seq_id]) - 1
        expected = logp[start:start + len(rows)].gather(-1, torch.tensor(rows["token_id"].tolist())[:, None])[:, 0]
        worst = max(worst, float(np.abs(expected.numpy() - rows["reference"].to_numpy(np.float64)).max()))
    assert worst < 2e-4, f"reference vs float64 forward: max |Δ| {worst:.3g}"


def test_bf16_gap_is_measured_and_nonzero(probed) -> None:
    """bf16 weights/activations move log-probs measurably (the dtype factor is real, not rounding noise)."""
    result, frame = probed
    row = next(r for r in result.summary["settings"] if r["name"] == "train_bf16")
    diff = _valid(frame, "train_bf16") - _valid(frame, "reference")
    assert row["vs_reference"]["mean_abs"] > 1e-3
    assert row["vs_reference"]["mean_abs"] == pytest.approx(np.abs(diff).mean(), rel=1e-12)
    fp16 = next(r for r in result.summary["settings"] if r["name"] == "train_fp16")
    assert 0 < fp16["vs_reference"]["mean_abs"] < row["vs_reference"]["mean_abs"], "fp16 has 3 more mantissa bits"


@pytest.mark.parametrize("against", ["vs_reference", "vs_rollout", "vs_baseline"])
def test_distances_match_float64_recomputation(probed, against: str) -> None:
    """Every stored distance equals a float64 recomputation from the per-token Parquet (orientation: x is the
    setting — or the rollout for vs_rollout — and kl = E[x − y])."""
    result, frame = probed
    for row in result.summary["settings"]:
        if row[against] is None:
            continue
        x, y = {"vs_reference": (row["name"], "reference"), "vs_rollout": ("rollout", row["name"]),
                "vs_baseline": (row["name"], row["baseline"])}[against]
        ell = _valid(frame, y) - _valid(frame, x)  # docs/metrics.md ℓ = a − b with a = y (trainer role), b = x
        clamped = np.clip(ell, -20, 20)
        expected = {"kl": float(np.mean(-ell)), "k3_kl": float(np.mean(np.expm1(clamped) - clamped)),
                    "mean_abs": float(np.abs(ell).mean()), "p99_abs": float(np.quantile(np.abs(ell), 0.99)),
                    "max_abs": float(np.abs(ell).max()), "frac_abs_gt_0.1": float((np.abs(ell) > 0.1).mean())}
        for key, value in expected.items():
            assert row[against][key] == pytest.approx(value, rel=1e-9, abs=1e-12), (row["name"], against, key)


def test_budget_is_share_of_observed_gap(probed) -> None:
    """share = mean |setting − baseline| / mean |rollout − reference|, recomputed from the Parquet."""
    result, frame = probed
    gap = np.abs(_valid(frame, "rollout") - _valid(frame, "reference")).mean()
    assert result.summary["gap"]["mean_abs"] == pytest.approx(gap, rel=1e-12)
    assert 0.02 < gap < 0.06, "the fixture's rollout is the reference plus N(0, 0.05²) noise"
    rows = {r["setting"]: r for r in result.summary["budget"]}
    assert set(rows) >= {"train_bf16", "train_fp16", "packed_512", "train_bf16_packed_4096", "chunk_16",
                         "attn_eager", "rollout"}
    for name, row in rows.items():
        effect = np.abs(_valid(frame, name) - _valid(frame, row["baseline"])).mean()
        assert row["share"] == pytest.approx(effect / gap, rel=1e-9, abs=1e-15), name
    assert rows["train_bf16_packed_4096"]["baseline"] == "train_bf16"


def test_files_are_complete_and_consistent(probed, probe_run: Run) -> None:
    result, frame = probed
    summary = json.loads((probe_run.path / "probes" / "trainer.json").read_text())
    assert summary["sample"] == {"sequences": 10, "tokens": len(frame), "valid_tokens": int(frame["mask"].sum()),
                                 "run_sequences": 12}
    assert summary["budget"] == json.loads(json.dumps(result.summary["budget"]))
    assert not list((probe_run.path / "probes").glob(".*")), "temporary files left behind"
    schema = pq.read_schema(probe_run.path / "probes" / "trainer.parquet")
    assert {"seq_id", "pos", "token_id", "mask", "rollout", "reference", "train_bf16"} <= set(schema.names)
    tokens = probe_run.tokens()
    merged = frame.merge(tokens, on=["seq_id", "pos"])
    assert len(merged) == len(frame)
    assert (merged["token_id_x"] == merged["token_id_y"]).all()
    assert np.array_equal(merged["rollout"].to_numpy(), merged["rollout_logprob"].to_numpy())


def test_sample_is_seeded_and_bounded(probe_run: Run) -> None:
    from rcdiag.probe.run import sample_tokens

    a, _ = sample_tokens(probe_run, 5, seed=3, vocab_size=10**6, max_context=None)
    b, pairs = sample_tokens(probe_run, 5, seed=3, vocab_size=10**6, max_context=None)
    c, _ = sample_tokens(probe_run, 500, seed=3, vocab_size=10**6, max_context=None)
    assert a.equals(b) and a["seq_id"].nunique() == 5 == len(pairs)
    assert c["seq_id"].nunique() == 12
    assert sum(len(r) for _, r in pairs) == len(a)


def test_attention_switched_in_place_equals_a_fresh_load(probed, probe_run: Run, probe_model) -> None:
    """One load per dtype, the attention switched on the loaded model, gives the numbers of a fresh load with that
    attention, bit for bit (the layout before this reuse loaded once per (dtype, attention))."""
    from rcdiag.probe.factors import FACTORS
    from rcdiag.probe.run import sample_tokens
    from rcdiag.score.scoring import load_config, load_model, model_limits, score_sequences
    from tests.probe.conftest import TEMPERATURE

    _, frame = probed
    vocab, context = model_limits(load_config(probe_model))
    _, pairs = sample_tokens(probe_run, 10, 0, vocab, context)
    for setting in FACTORS["attention"]:
        fresh = load_model(probe_model, dtype=setting.dtype, attn=setting.attn)
        if setting.token_budget is None:  # one sequence per forward, as the probe scores "alone" settings
            expected = np.concatenate([score_sequences(fresh, [pair], temperature=TEMPERATURE, token_budget=1 << 30,
                                                       chunk_tokens=setting.chunk_tokens).logprobs for pair in pairs])
        else:
            expected = score_sequences(fresh, pairs, temperature=TEMPERATURE, token_budget=setting.token_budget,
                                       chunk_tokens=setting.chunk_tokens).logprobs
        assert frame[setting.name].to_numpy(np.float32).tobytes() == expected.astype(np.float32).tobytes()


def test_one_trainer_load_per_dtype(probe_run: Run, monkeypatch: pytest.MonkeyPatch) -> None:
    """The attention grid in float32 plus the reference: one model load, not one per attention."""
    import rcdiag.score.scoring as scoring

    loads: list[tuple[str, str]] = []
    real = scoring.load_model

    def counting(path, **kwargs):
        loads.append((kwargs["dtype"], kwargs["attn"]))
        return real(path, **kwargs)

    monkeypatch.setattr(scoring, "load_model", counting)
    run_probe(probe_run.path, ProbeConfig(sample=3, factors=("attention", "train_dtype"), name="loads"),
              silent=True, write=False)
    assert sorted(d for d, _ in loads) == ["bfloat16", "float16", "float32"]
