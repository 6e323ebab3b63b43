"""Expanders whose content is drawn only while open (each drawn table or JSON viewer cost 30-40 ms of every
rerun of its page, open or not): closed, the content is absent; opened, it is there with the library's values."""
from __future__ import annotations

from app import aggregates, charts, data, judged, ui


def test_distributions_strata_tables_only_when_open(make_app, noisy_run):
    app = make_app(noisy_run, page="distributions")
    assert not app.exception
    assert "Strata tables" in [e.label for e in app.expander]
    assert len(app.dataframe) == 0 and "dist_table_choice" not in [s.key for s in app.selectbox]
    app.session_state["dist_tables"] = True
    app.run()
    assert not app.exception
    ref = data.open_ref(noisy_run.path)
    first = next(iter(aggregates.distributions(*ref.key, None)["strata"]))
    shown = app.dataframe[0].value
    expected = aggregates.distributions(*ref.key, None)["strata"][first]
    assert app.selectbox(key="dist_table_choice").value == first
    assert shown["tokens"].tolist() == expected["tokens"].tolist()


def test_overview_metrics_and_manifest_only_when_open(make_app, noisy_run):
    app = make_app(noisy_run)
    assert not app.exception
    assert {"All metrics", "Manifest"} <= {e.label for e in app.expander}
    tables = len(app.dataframe)  # the run settings
    manifests = len(app.json)  # the checks' evidence
    app.session_state["overview_metrics_open"] = True
    app.session_state["overview_manifest_open"] = True
    app.run()
    assert not app.exception
    assert len(app.dataframe) == tables + 1
    table = next(d.value for d in app.dataframe if list(d.value.columns) == ["metric", "value"])
    ref = data.open_ref(noisy_run.path)
    values = judged.headline(*ref.key)
    assert dict(zip(table["metric"], table["value"], strict=True)) == {k: ui.fmt(v) for k, v in values.items()}
    assert len(app.json) == manifests + 1


def test_overview_draws_the_distributions_histogram_without_that_page_s_other_charts(make_app, tmp_path,
                                                                                    monkeypatch):
    """The Overview's ℓ histogram is the Distributions page's own spec (same bins, same counts), built without the
    page's density and strata charts, which app.warm builds after the Overview."""
    from app import distview, warm
    from tests.fixtures.runs import build_run

    run = build_run(tmp_path / "run", "clean", noise=0.5, seed=13)  # its own: no other test filled its caches
    monkeypatch.setattr(warm, "after_overview", lambda *key: None)
    kinds = []
    real = charts.spec
    monkeypatch.setattr(charts, "spec", lambda kind, *a, **k: kinds.append(kind) or real(kind, *a, **k))
    app = make_app(run)
    assert not app.exception
    assert kinds == ["histogram"]
    ref = data.open_ref(run.path)
    page = distview.view(*ref.key, None)["charts"]["histogram"]
    drawn = distview.run_histogram(*ref.key)
    assert drawn["datasets"]["table"].equals(page["datasets"]["table"])
    assert {k: v for k, v in drawn.items() if k != "datasets"} == {k: v for k, v in page.items() if k != "datasets"}
