"""Every dashboard page through streamlit's AppTest on small synthetic runs, checked against float64 references."""
from __future__ import annotations

import html
import re

import numpy as np
import pandas as pd
import pytest

import rcdiag
from app import bands, data, ui
from app.simvalues import lower_refusal, shown
from app.text import plain
from rcdiag.checks.verdicts import run_checks
from tests.dashboard.conftest import assert_clean

CARD = re.compile(r'<div style="font-size:0.8em;color:#555">[^<]*· ([\w.]+)</div><div [^>]*>([^<]*)</div>'
                  r'<div [^>]*>(\w[\w/]*)</div>')


def valid_tokens(run) -> pd.DataFrame:
    """Valid token rows with float64 a, b and ℓ = a − b (the independent reference's input)."""
    tokens = run.tokens()
    tokens = tokens[tokens["mask"]].copy()
    tokens["a"] = tokens["train_logprob"].astype(np.float64)
    tokens["b"] = tokens["rollout_logprob"].astype(np.float64)
    tokens["l"] = tokens["a"] - tokens["b"]
    return tokens


def token_truncate_reference(tokens: pd.DataFrame, threshold: float) -> dict[str, float]:
    """docs/metrics.md token_truncate (TIS) in float64: w = min(ρ, C), ρ = exp(clamp(ℓ, ±20))."""
    rho = np.exp(np.clip(tokens["l"].to_numpy(), -20, 20))
    w = np.minimum(rho, threshold)
    return {"clipped_frac": float(np.mean(rho > threshold)), "is_weight_mean": float(w.mean()),
            "ess": float(1 / np.mean((w / w.mean()) ** 2))}


def cards(app) -> dict[str, tuple[str, str]]:
    """{metric: (shown value, status)} of the Overview cards."""
    found = {}
    for element in app.get("html"):
        for metric, value, status in CARD.findall(element.proto.body):
            found[metric] = (html.unescape(value), status)
    return found


def shown_metrics(app) -> dict[str, str]:
    return {m.label: m.value for m in app.metric}


def test_overview_cards_match_float64_reference(make_app, noisy_run):
    """The cards show compute_metrics/tails/simulate values — checked here against a float64 reference — coloured
    by their band (a noisy run: mean |ℓ| ≈ 0.33 must not read 'healthy')."""
    app = make_app(noisy_run)
    assert_clean(app)
    shown = cards(app)
    assert set(shown) == {b.metric for b in bands.BANDS}
    tokens = valid_tokens(noisy_run)
    ref = {"kl": float((tokens["b"] - tokens["a"]).mean()), "abs_log_ratio_mean": float(tokens["l"].abs().mean()),
           "abs_log_ratio_max": float(tokens["l"].abs().max())}
    tis = token_truncate_reference(tokens, 2.0)
    ref.update(ess=tis["ess"], is_weight_mean=tis["is_weight_mean"])
    for metric, value in ref.items():
        assert shown[metric][0] == ui.fmt(value), (metric, shown[metric], value)
    for band in bands.BANDS:
        value = float(shown[band.metric][0])
        assert shown[band.metric][1] == band.classify(value), band.metric
    assert shown["abs_log_ratio_mean"][1] == bands.WARNING
    assert any(f"tokens: {len(tokens):,} · sequences: 60" in c.value for c in app.caption)
    labels = [e.label for e in app.expander]
    expected = [f"{f.severity} · {f.name}: {f.message}" for f in run_checks(noisy_run)]
    assert [plain(label) for label in labels if " · " in label and ": " in label] == expected
    assert "Manifest" in labels


def test_overview_of_clean_run_is_healthy(make_app, clean_dash_run):
    app = make_app(clean_dash_run)
    assert_clean(app)
    shown = cards(app)
    assert shown["kl"][1] == bands.HEALTHY and shown["ess"][1] == bands.HEALTHY, shown


@pytest.mark.parametrize("value,status", [(0.0, "healthy"), (0.01, "healthy"), (-0.05, "warning"), (0.1, "warning"),
                                          (0.1000001, "alarm"), (-2.0, "alarm"), (float("nan"), "n/a")])
def test_kl_band_edges(value, status):
    """Band edges are inclusive and kl is judged by its absolute value (it can be negative)."""
    assert bands.BANDS[0].classify(value) == status


def test_ess_and_weight_mean_bands():
    by_name = {b.metric: b for b in bands.BANDS}
    assert [by_name["ess"].classify(v) for v in (0.9996, 0.5, 0.29)] == ["healthy", "warning", "alarm"]
    assert [by_name["is_weight_mean"].classify(v) for v in (1.0, 0.6, 2.5, 0.4)] == \
        ["healthy", "warning", "alarm", "alarm"]


def test_simulator_threshold_changes_clipped_frac(make_app, noisy_run):
    """Moving the threshold changes clipped_frac to exactly rcdiag.simulate's value (and the float64 reference),
    written as a share in percent with its change against no correction."""
    app = make_app(noisy_run, page="simulator")
    assert_clean(app)
    tokens = valid_tokens(noisy_run)
    before = shown_metrics(app)
    assert before["clipped_frac"] == shown("clipped_frac", token_truncate_reference(tokens, 2.0)["clipped_frac"])
    assert 1.25 in data.threshold_grid() and 1.01 in data.threshold_grid()
    app.select_slider(key="sim_threshold").set_value(1.25).run()
    assert_clean(app)
    after = shown_metrics(app)
    expected = rcdiag.simulate(noisy_run, "token_truncate", threshold=1.25)
    assert after["clipped_frac"] == shown("clipped_frac", expected["clipped_frac"]) != before["clipped_frac"]
    reference = token_truncate_reference(tokens, 1.25)
    assert after["clipped_frac"] == shown("clipped_frac", reference["clipped_frac"])
    assert after["is_weight_mean"] == shown("is_weight_mean", reference["is_weight_mean"])
    assert after["ess"] == shown("ess", reference["ess"])
    raw = rcdiag.simulate(noisy_run, "token_truncate", threshold=data.UNCORRECTED)
    delta = {m.label: m.delta for m in app.metric}
    assert delta["is_weight_mean"] == f"{reference['is_weight_mean'] - raw['is_weight_mean']:+.4g}"
    assert all(v not in ("1", "0") for v in after.values()), after


@pytest.mark.parametrize("mode,convention,lower", [("sequence_mask", "canonical", None), ("token_mask", "verl", 0.8),
                                                   ("sequence_truncate", "swift", None), ("token_truncate", "trl", 0.5)])
def test_simulator_mode_convention_lower(make_app, noisy_run, mode, convention, lower):
    """Every widget reaches rcdiag.simulate: the shown values equal simulate(mode, C, L, convention)."""
    app = make_app(noisy_run, page="simulator")
    app.selectbox(key="sim_mode").set_value(mode)
    app.selectbox(key="sim_convention").set_value(convention)
    app.select_slider(key="sim_threshold").set_value(1.5)
    if lower is not None:
        app.checkbox(key="sim_use_lower").check().run()
        app.number_input(key="sim_lower").set_value(lower)
    app.run()
    assert_clean(app)
    expected = rcdiag.simulate(noisy_run, mode, threshold=1.5, lower=lower, convention=convention)
    values = shown_metrics(app)
    for name in ("is_weight_mean", "ess", "clipped_frac", "kept_token_frac", "kept_seq_frac"):
        assert values[name] == shown(name, float(expected[name])), name


@pytest.mark.parametrize("mode,convention", [("token_truncate", "swift"), ("sequence_truncate", "verl"),
                                             ("token_mask", "swift")])
def test_simulator_disables_a_lower_bound_the_convention_lacks(make_app, noisy_run, mode, convention):
    """verl + L + sequence_truncate used to blank the page: the checkbox is disabled with the reason, the values
    are those without L, and a link asking for L anyway opens the same, clean view."""
    app = make_app(noisy_run, page="simulator")
    app.checkbox(key="sim_use_lower").check().run()  # L = 0.5 under canonical, then the convention changes
    app.selectbox(key="sim_mode").set_value(mode)
    app.selectbox(key="sim_convention").set_value(convention).run()
    assert_clean(app)
    box = app.checkbox(key="sim_use_lower")
    assert box.disabled and convention in box.help
    assert any("Lower bound unavailable" in c.value and convention in c.value for c in app.caption)
    expected = rcdiag.simulate(noisy_run, mode, threshold=2.0, convention=convention)
    assert shown_metrics(app)["clipped_frac"] == shown("clipped_frac", expected["clipped_frac"])
    assert lower_refusal("token_mask", "verl") is None and lower_refusal("token_truncate", "canonical") is None


def test_distributions_filters_change_the_counts(make_app, noisy_run):
    """The token count under a finish-reason / length filter equals a pandas count of the same tokens."""
    app = make_app(noisy_run, page="distributions")
    assert_clean(app)
    tokens = valid_tokens(noisy_run)
    seqs = noisy_run.sequences()
    assert f"{len(tokens):,} valid tokens in {len(seqs):,} sequences" in app.caption[0].value
    app.multiselect(key="dist_finish").set_value(["stop"])
    app.button(key="dist_apply").click().run()
    stop = seqs.loc[seqs["finish_reason"] == "stop", "seq_id"]
    expected = tokens[tokens["seq_id"].isin(stop)]
    assert f"{len(expected):,} valid tokens in {len(stop):,} sequences" in app.caption[0].value
    mean_abs = ui.fmt(float(expected["l"].abs().mean()))
    assert f"mean |ℓ| {mean_abs}" in app.caption[0].value
    app.slider(key="dist_length").set_value((20, 30))
    app.button(key="dist_apply").click().run()
    chosen = seqs[(seqs["finish_reason"] == "stop") & seqs["response_len"].between(20, 30)]["seq_id"]
    assert f"{tokens['seq_id'].isin(chosen).sum():,} valid tokens in {len(chosen):,}" in app.caption[0].value
    assert_clean(app)


def test_distributions_empty_filter_is_a_warning(make_app, noisy_run):
    app = make_app(noisy_run, page="distributions")
    app.multiselect(key="dist_finish").set_value([])
    app.button(key="dist_apply").click().run()
    assert not app.exception and "No sequence passes" in app.warning[0].value


def test_sequences_sorted_paged_and_token_strip(make_app, noisy_run):
    """Sorted by max |ℓ| the first sequence is the pandas argmax; its strip has one span per token row with
    both log-probs in the hover text, and token text decoded by the manifest's tokenizer."""
    app = make_app(noisy_run, page="sequences")
    assert_clean(app)
    tokens = valid_tokens(noisy_run)
    worst = tokens.groupby("seq_id")["l"].apply(lambda s: s.abs().max()).sort_values(ascending=False)
    select = app.selectbox(key="seq_select")
    assert select.options[:3] == [f"seq {i}" for i in worst.index[:3]]
    assert len(select.options) == 25
    strip = next(h.proto.body for h in app.get("html") if "rcdiag-token-strip" in h.proto.body)
    rows = noisy_run.tokens()
    first = rows[rows["seq_id"] == worst.index[0]].sort_values("pos")
    assert strip.count('class="rcdiag-tok') == len(first)
    row = first.iloc[0]
    assert f"trainer a = {float(row['train_logprob']):.6g}" in html.unescape(strip)
    assert f"engine b = {float(row['rollout_logprob']):.6g}" in html.unescape(strip)
    assert f">w{int(row['token_id'])}<" in strip
    app.number_input(key="seq_page").set_value(3).run()
    assert app.selectbox(key="seq_select").options[0] == f"seq {worst.index[50]}"
    assert len(app.selectbox(key="seq_select").options) == len(worst) - 50


def test_sequences_choose_and_sort_by_ratio(make_app, clean_dash_run):
    """Sorting by sequence ratio ascending and picking a sequence shows that sequence (ids when no tokenizer)."""
    app = make_app(clean_dash_run, page="sequences")
    app.selectbox(key="seq_sort").set_value("sequence ratio")
    app.toggle(key="seq_desc").set_value(False).run()
    stats = rcdiag.open_run(clean_dash_run.path).tokens()
    stats = stats[stats["mask"]]
    mean_l = (stats["train_logprob"].astype(float) - stats["rollout_logprob"].astype(float)).groupby(stats["seq_id"]).mean()
    assert app.selectbox(key="seq_select").options[0] == f"seq {mean_l.idxmin()}"
    target = app.selectbox(key="seq_select").options[4]
    app.selectbox(key="seq_select").set_value(int(target.split()[1])).run()
    assert_clean(app)
    assert app.subheader[0].value == target.replace("seq", "Sequence")
    strip = next(h.proto.body for h in app.get("html") if "rcdiag-token-strip" in h.proto.body)
    assert re.search(r">\[\d+\]<", strip), "without a tokenizer the strip shows token ids"


def test_compare_two_runs(make_app, noisy_run, clean_dash_run):
    app = make_app(noisy_run, clean_dash_run, page="compare")
    assert_clean(app)
    table = app.dataframe[0].value.set_index("metric")
    assert list(table.columns) == ["noisy", "clean", "Δ clean"]
    assert all(pd.api.types.is_float_dtype(table[c]) for c in table.columns), table.dtypes  # numbers sort
    kl = {}
    for run, name in ((noisy_run, "noisy"), (clean_dash_run, "clean")):
        tokens = valid_tokens(run)
        kl[name] = float((tokens["b"] - tokens["a"]).mean())
        assert table.loc["kl", name] == pytest.approx(kl[name], rel=1e-9, abs=1e-12)
        assert table.loc["tokens", name] == len(tokens)
    assert table.loc["kl", "Δ clean"] == pytest.approx(kl["clean"] - kl["noisy"], rel=1e-9, abs=1e-12)


def test_compare_needs_two_runs(make_app, noisy_run):
    app = make_app(noisy_run, page="compare")
    assert not app.exception and "at least two runs" in app.info[0].value


def test_overview_lists_the_run_settings(make_app, noisy_run):
    """Engine / trainer / sampling settings of the manifest appear as a table (temperature, dtypes, logprobs_mode)."""
    app = make_app(noisy_run)
    table = next(d.value for d in app.dataframe if "setting" in d.value.columns)
    settings = dict(zip(table["setting"], table["value"], strict=True))
    engine = noisy_run.manifest["engine"]
    assert settings["engine.logprobs_mode"] == engine["logprobs_mode"]
    assert settings["engine.temperature"] == str(engine["temperature"])
    assert settings["trainer.dtype"] == noisy_run.manifest["trainer"]["dtype"]
    assert settings["counts.tokens"] == str(noisy_run.num_tokens)


def test_rewritten_run_is_not_served_from_cache(make_app, tmp_path):
    """The cache key includes the manifest mtime: a run re-written in place shows its new numbers."""
    import os
    import time

    from tests.fixtures.runs import defect_frames

    tokens, sequences = defect_frames("clean", seed=21)
    run = rcdiag.write_run(tmp_path / "again", tokens, sequences)
    app = make_app(run)
    first = cards(app)["kl"][0]
    time.sleep(0.05)
    tokens["train_logprob"] = (tokens["train_logprob"] - 0.05).astype("float32")
    rewritten = rcdiag.write_run(run.path, tokens, sequences, overwrite=True)
    os.utime(rewritten.path / "manifest.json")
    app.run()
    assert_clean(app)
    second = cards(app)["kl"][0]
    assert second != first
    assert second == ui.fmt(rcdiag.compute_metrics(rewritten)["kl"])
