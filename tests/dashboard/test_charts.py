"""app.charts: Vega-Lite specs whose data sit where Streamlit sends them as Arrow, and whose JSON does not change
with the data (so a new filter swaps data in the browser's view instead of re-creating it)."""
from __future__ import annotations

import json

import pandas as pd
import pytest

from app import aggregates, charts, data
from rcdiag.probe.summary import budget_frame


def _without_data(spec: dict) -> dict:
    """The spec as Streamlit serialises it to JSON: its `datasets` go as Arrow."""
    return {k: v for k, v in spec.items() if k != "datasets"}


@pytest.fixture(scope="module")
def two_scans(noisy_run):
    """The whole run's scan and one of its half (by response length): two data for the same charts."""
    ref = data.open_ref(noisy_run.path)
    index = data.sequence_index(*ref.key)
    cut = float(index["response_len"].median())
    return [aggregates.distributions(*ref.key, f) for f in (None, (None, None, (0.0, cut)))]


@pytest.mark.parametrize("kind", ["histogram", "density", "strata"])
def test_spec_json_is_the_same_for_other_data(two_scans, kind):
    """The density's diagonal once sat in the spec as inline rows over the occupied range: each filter changed the
    spec, and the browser re-created the chart. Every chart's JSON now holds no data (json.dumps would refuse a
    frame left inside a layer), and the frames differ."""
    frames = {"histogram": lambda r: aggregates.histogram(r["tails"]),
              "density": lambda r: aggregates.density(r["tails"]),
              "strata": lambda r: r["strata"]["position"]}[kind]
    options = {"title": "position"} if kind == "strata" else {}
    specs = [charts.spec(kind, frames(r), **options) for r in two_scans]
    texts = [json.dumps(_without_data(s), sort_keys=True) for s in specs]
    assert texts[0] == texts[1]
    tables = [s["datasets"].get(charts.TABLE, s["datasets"].get("cells")) for s in specs]
    assert all(isinstance(t, pd.DataFrame) for t in tables)
    assert not tables[0].equals(tables[1])


def test_density_diagonal_spans_the_occupied_range(two_scans):
    frame = aggregates.density(two_scans[0]["tails"])
    spec = charts.spec("density", frame)
    low = float(min(frame["a_lo"].min(), frame["b_lo"].min()))
    assert spec["datasets"]["diagonal"]["v"].tolist() == [low, 0.0]


def test_budget_bars_are_the_summary_rows_in_order():
    """The Probes page's bars (Vega-Lite JSON: the Altair import alone took 0.2 s): one bar per budget row, in the
    summary's order, labelled factor: setting, share on a symlog axis."""
    summary = {"budget": [
        {"factor": "train_dtype", "setting": "train_bf16", "baseline": "reference", "side": "trainer",
         "mean_abs": 0.02, "k3_kl": 1e-4, "share": 0.8, "share_k3": 0.7},
        {"factor": "packing", "setting": "packed_4096", "baseline": "reference", "side": "trainer",
         "mean_abs": 0.0, "k3_kl": 0.0, "share": 0.0, "share_k3": 0.0}]}
    spec = charts.spec("budget", budget_frame(summary))
    rows = spec["datasets"][charts.TABLE]
    assert rows["label"].tolist() == ["train_dtype: train_bf16", "packing: packed_4096"]
    assert rows["share"].tolist() == [0.8, 0.0]
    assert spec["encoding"]["x"]["scale"]["type"] == "symlog"
    assert spec["encoding"]["y"]["sort"] is None  # row order, not alphabetical
