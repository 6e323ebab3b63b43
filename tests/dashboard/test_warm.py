"""app.warm: after the Overview, the pages' first views are in the caches before the reader opens them."""
from __future__ import annotations

import threading
import traceback

import pyarrow.parquet as pq
import pytest

import rcdiag.store.run as store_run
from app import charts, data, distview, judged, simchart, warm
from app.simvalues import CURVES
from rcdiag.analysis.conventions import DEFAULT_CONVENTION
from rcdiag.analysis.correction.modes import MODES
from tests.fixtures.runs import build_run


def test_warming_fills_what_the_pages_open_with(tmp_path, monkeypatch):
    """The Distributions page's charts, the simulator's first chart (its widgets' defaults: the first mode and
    curve) and the Sequences page's first sequence (its default order: data.SORT_KEYS' first, descending) come
    from the caches afterwards: no spec left to build, no Parquet read left for the page to make."""
    run = build_run(tmp_path / "run", "clean", noise=0.5, seed=11)  # its own: no other test filled its caches
    ref = data.open_ref(run.path)
    warm.after_overview(*ref.key)
    for thread in [t for t in threading.enumerate() if t.name == "rcdiag-warm"]:
        thread.join(timeout=120)
    index = data.sequence_index(*ref.key)
    column = next(iter(data.SORT_KEYS.values()))
    first = int(index.sort_values([column, "seq_id"], ascending=[False, True])["seq_id"].iloc[0])

    def refuse(*args, **kwargs):
        raise AssertionError("read after warming")
    monkeypatch.setattr(pq, "read_table", refuse)
    monkeypatch.setattr(charts, "spec", refuse)
    monkeypatch.setattr(simchart, "datasets", refuse)
    assert set(distview.view(*ref.key, None)["charts"]) == {"histogram", "density", "position", "rollout_prob",
                                                             "entropy"}
    first_chart = simchart.chart(*ref.key, tuple(MODES), next(iter(MODES)), None, DEFAULT_CONVENTION, CURVES[0],
                                 judged.recommended_setting(*ref.key))
    assert set(first_chart["datasets"]["mine"]["mode"]) == {next(iter(MODES))}
    row, tokens = data.sequence_detail(*ref.key, first)
    assert row["seq_id"] == first and len(tokens) == row["response_len"]
    with pytest.raises(AssertionError, match="read after warming"):  # the guard itself works
        data.sequence_detail(*ref.key, int(index["seq_id"].iloc[-1]) if first != int(index["seq_id"].iloc[-1])
                             else int(index["seq_id"].iloc[0]))


def test_the_run_is_checked_once_per_stamp(tmp_path, monkeypatch):
    """The door check (the run's structure: every file's seq_id column) runs once for the Overview's judged pass
    and every loader the warming thread fills (runcheck.checked_run), not once per loader."""
    run = build_run(tmp_path / "run", "clean", noise=0.5, seed=12)
    checks = []
    real = store_run.validate_run
    monkeypatch.setattr(store_run, "validate_run",
                        lambda *a: checks.append("".join(traceback.format_stack(limit=8))) or real(*a))
    ref = data.open_ref(run.path)
    judged.report(*ref.key)
    warm.after_overview(*ref.key)
    for thread in [t for t in threading.enumerate() if t.name == "rcdiag-warm"]:
        thread.join(timeout=120)
    assert data.trend_frame(*ref.key, DEFAULT_CONVENTION, 2.0) is not None  # the warming reached its last loader
    assert len(checks) == 1, "\n".join(checks)
