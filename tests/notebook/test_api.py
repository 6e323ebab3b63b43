"""The notebook API on Run: results checked against independent float64 numpy references, HTML and figures."""
from __future__ import annotations

import subprocess
import sys

import numpy as np
import pandas as pd
import pytest
from matplotlib.figure import Figure
from transformers import AutoTokenizer

import rcdiag
from rcdiag.errors import ConfigError
from rcdiag.notebook import Result, compare, fmt
from tests.fixtures.runs import build_run
from tests.importers.dumps import train_tokenizer


@pytest.fixture(scope="module")
def noisy(tmp_path_factory):
    """A run with a large mismatch (noise 0.6) so that every IS mode clips and masks something."""
    return build_run(tmp_path_factory.mktemp("nb") / "noisy", noise=0.6, n_seq=40, seed=3)


def _reference(run):
    """Valid token rows with ℓ = a − b in float64 (independent of rcdiag.analysis.metrics.compute)."""
    tok = run.tokens()
    tok = tok[tok["mask"]].copy()
    tok["ell"] = tok["train_logprob"].astype(np.float64) - tok["rollout_logprob"].astype(np.float64)
    return tok


def test_runstore_does_not_import_the_heavy_layers():
    code = ("import sys, rcdiag.store.run; print([m for m in ('rcdiag.analysis.metrics.compute', 'rcdiag.analysis.correction.modes', "
            "'rcdiag.notebook', 'rcdiag.report.plots', 'matplotlib', 'pandas') if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_metrics_is_a_rendering_dict_equal_to_the_reference(noisy):
    ref = _reference(noisy)
    m = noisy.metrics()
    assert isinstance(m, Result) and isinstance(m, dict)
    assert m == rcdiag.compute_metrics(noisy)
    assert m["kl"] == pytest.approx(float((-ref["ell"]).mean()), rel=1e-12)
    assert m["tokens"] == len(ref)
    verl = noisy.metrics(convention="verl")
    assert verl["k3_kl"] == pytest.approx(float((np.exp(ref["ell"]) - ref["ell"] - 1).mean()), rel=1e-10)
    html = m._repr_html_()
    assert "<td>kl</td>" in html and fmt(m["kl"]) in html and "metrics (canonical)" in html


def test_simulate_and_sweep_match_reference(noisy):
    ref = _reference(noisy)
    rho = np.exp(np.clip(ref["ell"].to_numpy(), -20, 20))
    result = noisy.simulate("token_truncate", threshold=1.5)
    assert result["is_weight_mean"] == pytest.approx(np.minimum(rho, 1.5).mean(), rel=1e-12)
    assert result["clipped_frac"] == pytest.approx((rho > 1.5).mean(), rel=1e-12)
    assert 0 < result["clipped_frac"] < 1, "the fixture must clip some tokens"
    masked = noisy.simulate("token_mask", threshold=1.5)
    assert masked["kept_token_frac"] == pytest.approx((rho <= 1.5).mean(), rel=1e-12)
    assert "token_truncate at C = 1.5" in result._repr_html_()
    with_weights = noisy.simulate("token_truncate", threshold=1.5, return_weights=True)
    joined = ref.merge(with_weights["weights"], on=["seq_id", "pos"], how="left")
    np.testing.assert_allclose(joined["weight"].to_numpy(), np.minimum(rho, 1.5), rtol=1e-12)
    assert "<td>weights</td>" not in with_weights._repr_html_(), "the weights frame is a value, not a table row"
    table = noisy.sweep(modes=["token_truncate", "sequence_mask"], thresholds=(1.5, 3.0))
    assert list(zip(table["mode"], table["threshold"], strict=True)) == [
        ("token_truncate", 1.5), ("token_truncate", 3.0), ("sequence_mask", 1.5), ("sequence_mask", 3.0)]
    assert table.iloc[0]["is_weight_mean"] == pytest.approx(result["is_weight_mean"], rel=1e-12)


def test_worst_sequences_ranking(noisy):
    ref = _reference(noisy)
    per_seq = ref.groupby("seq_id")["ell"].agg(["mean", "sum", lambda x: x.abs().max()])
    per_seq.columns = ["mean", "sum", "max"]
    for by in ("mean", "sum", "max"):
        expected = per_seq[by].abs().sort_values(ascending=False, kind="stable").index[:4].tolist()
        worst = noisy.worst_sequences(4, by=by)
        assert worst["seq_id"].tolist() == expected, by
    worst = noisy.worst_sequences(3)
    seqs = noisy.sequences().set_index("seq_id")
    assert worst["response_text"].tolist() == seqs.loc[worst["seq_id"], "response_text"].tolist()
    assert worst["mean_log_ratio"].tolist() == pytest.approx(per_seq.loc[worst["seq_id"], "mean"].tolist())
    assert len(noisy.worst_sequences(1000)) == noisy.num_sequences
    assert noisy.worst_sequences(0).empty
    with pytest.raises(ConfigError, match="by='median'"):
        noisy.worst_sequences(3, by="median")


def test_worst_sequences_decode_without_text_and_skip_empty(tmp_path):
    """A run without response text is decoded with the tokenizer; all-masked/empty sequences are never ranked."""
    tok_dir = train_tokenizer(tmp_path / "tok")
    tokenizer = AutoTokenizer.from_pretrained(tok_dir)
    ids = [tokenizer("the answer is 42")["input_ids"], tokenizer("hello world")["input_ids"]]
    rows = [(s, p, t, -1.0, -1.0 + 0.1 * (s + 1), True) for s, seq in enumerate(ids) for p, t in enumerate(seq)]
    rows.append((2, 0, 5, -1.0, 3.0, False))  # all masked: no valid token
    tokens = pd.DataFrame(rows, columns=["seq_id", "pos", "token_id", "rollout_logprob", "train_logprob", "mask"])
    run = rcdiag.write_run(tmp_path / "run", tokens, pd.DataFrame({"seq_id": [0, 1, 2, 3]}))  # 3: empty
    worst = run.worst_sequences(10, tokenizer=tokenizer)
    assert worst["seq_id"].tolist() == [1, 0]
    assert worst["response_text"].tolist() == ["hello world", "the answer is 42"]


def test_sequence_view_html(noisy):
    tok = noisy.tokens()
    seq_id = int(tok.loc[~tok["mask"], "seq_id"].iloc[0])  # a sequence with a masked token
    view = noisy.sequence(seq_id)
    rows = tok[tok["seq_id"] == seq_id]
    assert view.frame["token_id"].tolist() == rows["token_id"].tolist()
    expected = rows["train_logprob"].astype(float) - rows["rollout_logprob"].astype(float)
    assert view.frame["log_ratio"].tolist() == pytest.approx(expected.tolist(), abs=0)
    html = view._repr_html_()
    assert html.count("class='tok masked'") == int((~rows["mask"]).sum())
    assert html.count("<span class='tok") == len(rows)
    strongest = expected[rows["mask"]].abs().idxmax()
    colour = "rgb(255,80,80)" if expected[strongest] > 0 else "rgb(80,80,255)"
    assert colour in html, "the largest |ℓ| must take the full colour of its sign"
    with pytest.raises(ConfigError, match="no sequence 99999"):
        noisy.sequence(99999)


def test_plots_are_figures_with_the_data(noisy, tmp_path):
    ref = _reference(noisy)
    hist = noisy.plot.histogram()
    assert isinstance(hist, Figure)
    counts = hist.axes[0].patches[0].get_data().values
    assert counts.sum() == len(ref), "the histogram must hold every valid token once"
    other = build_run(tmp_path / "other", noise=0.1, n_seq=20, seed=4)
    overlay = noisy.plot.histogram(other)
    assert overlay.axes[0].get_legend_handles_labels()[1] == ["noisy", "other"]
    strata = noisy.plot.strata("finish_reason")
    assert sorted(t.get_text() for t in strata.axes[0].get_xticklabels()) == ["length", "stop"]
    with pytest.raises(ConfigError, match="unknown stratum"):
        noisy.plot.strata("colour")
    assert isinstance(noisy.plot.density(), Figure)
    sweep = noisy.plot.sweep(modes=["token_mask", "sequence_truncate"])  # all modes on ESS above, clipped % below
    assert [a.get_ylabel() for a in sweep.axes] == ["ESS / N", "clipped (%)"]
    assert [t.get_text() for t in sweep.legends[0].get_texts()] == ["token_mask", "sequence_truncate"]
    assert [len(a.get_lines()) for a in sweep.axes] == [3, 2]  # a curve per mode (and the ESS target above)
    seq_id = int(ref["seq_id"].iloc[0])
    bars = noisy.plot.sequence(seq_id).axes[0].containers[0]  # the BarContainer (axvspan shading excluded)
    valid = ref[ref["seq_id"] == seq_id]["ell"].to_numpy()
    assert [b.get_height() for b in bars] == pytest.approx(valid.tolist())


def test_run_html_card(noisy, tmp_path):
    html = noisy._repr_html_()
    assert str(noisy.path) in html and "Headline metrics (canonical)" in html
    assert fmt(noisy.metrics()["kl"]) in html and "processed_logprobs" in html
    assert "call <code>run.metrics()</code>" in rcdiag.notebook.run_html(noisy, max_tokens=0)
    tokens = pd.DataFrame({"seq_id": [0, 0], "pos": [0, 1], "token_id": [1, 2],
                           "rollout_logprob": [None, None]})
    source = {"kind": "imported:trl", "retokenized": True, "lacks": ["rollout <logprobs>"], "warnings": []}
    retok = rcdiag.write_run(tmp_path / "retok", tokens, manifest={"source": source})
    html = retok._repr_html_()
    assert "RETOKENIZED" in html and "rollout &lt;logprobs&gt;" in html and "Metrics unavailable" in html


def test_compare(noisy, tmp_path):
    other = build_run(tmp_path / "other", noise=0.1, n_seq=20, seed=4)
    frame = compare([noisy, other])
    assert list(frame.columns) == ["noisy", "other", "difference"]
    assert frame.loc["kl", "difference"] == pytest.approx(other.metrics()["kl"] - noisy.metrics()["kl"])
    assert frame.loc["sequences", "other"] == 20
    assert list(rcdiag.compare({"a": noisy, "b": other, "c": other}).columns) == ["a", "b", "c"]
    twin = build_run(tmp_path / "twin" / "noisy", noise=0.1, n_seq=20, seed=4)
    assert list(compare([noisy, twin]).columns) == [f"noisy-{noisy.path.parent.name}", "noisy-twin", "difference"]
