"""The dashboard's Routing page (app/views/routing.py) on a routed MoE run, opened through the real app with
Streamlit's AppTest and in headless Chromium (`rcdiag dashboard` as a subprocess): the report's numbers (agreement,
routing's share, |ℓ| by agreement) on the page, listed in the navigation only for runs that carry routes."""
from __future__ import annotations

import shutil
import sys

import pandas as pd
import pytest
from streamlit.testing.v1 import AppTest

from rcdiag.report.build import judge
from rcdiag.store.run import open_run
from rcdiag.store.writer import write_run
from tests.dashboard.conftest import APP
from tests.dashboard.test_browser import assert_no_exception, page, server, settle, traffic  # noqa: F401 (fixtures)
from tests.moe.routed_runs import MoESpec, write_moe_run


@pytest.fixture(scope="module")
def routed(tmp_path_factory):
    path, _ = write_moe_run(tmp_path_factory.mktemp("dash") / "moe", MoESpec(n_seq=120, seed=3))
    return path


def _open(monkeypatch, path):
    monkeypatch.setattr(sys, "argv", [str(APP), str(path)])
    test = AppTest.from_file(str(APP), default_timeout=180)
    test.run()
    return test


def test_routing_page_shows_the_reports_numbers(routed, monkeypatch):
    """The page's cards are the report's summary (tokens with a differing layer, agreeing choices, routing's
    share), its verdict banner names routing, and its tables have a row per layer and per disagreement bin."""
    summary = judge(open_run(routed)).routing.summary
    test = _open(monkeypatch, routed)
    test.switch_page("views/routing.py").run()
    assert not test.exception and not test.error
    assert any(h.value == "Routing · moe" for h in test.header)
    cards = {m.label: m.value for m in test.metric}
    assert cards["tokens with a differing layer"] == f"{summary.any_disagree_share:.1%}"
    assert cards["(token, layer) choices that agree"] == f"{summary.exact_rate:.1%}"
    assert cards["routing explains"] == f"{summary.explains.share:.0%}"
    assert any("routing differences explain" in w.value for w in [*test.warning, *test.error])
    frames = [d.value for d in test.dataframe]
    assert len(frames) == 3
    assert list(frames[0]["tokens"]) == [r["tokens"] for r in summary.by_disagreement]
    by_layer = next(v for v in frames if "exact" in v.columns)
    assert list(by_layer["exact"]) == pytest.approx(summary.exact_by_layer)


def test_routing_page_is_listed_only_for_routed_runs(routed, tmp_path):
    """dashboard.shown lists the Routing row for the routed run, not for a dense run nor for a path outside the
    path policy."""
    sys.path.insert(0, str(APP.parent.parent))
    from app.dashboard import shown

    dense = write_run(tmp_path / "dense", pd.DataFrame({"seq_id": [0], "pos": [0], "rollout_logprob": [-1.0],
                                                        "train_logprob": [-1.0]}))
    given = [str(routed), str(dense.path)]
    assert "routing.py" in [row[0] for row in shown(str(routed), given)]
    assert "routing.py" not in [row[0] for row in shown(str(dense.path), given)]
    assert "routing.py" not in [row[0] for row in shown("/etc", given)]
    outside = shutil.copytree(routed, tmp_path / "outside")  # routed, but outside the path policy
    assert "routing.py" not in [row[0] for row in shown(str(outside), given)]
    assert "routing.py" not in [row[0] for row in shown(None, given)]


def test_no_page_text_leaks_from_the_entry_script():
    """Streamlit's magic writes every bare string expression of a script onto the page: app/dashboard.py may hold
    none but its module docstring (a docstring under ONLY_FOR appeared above every page's header)."""
    import ast

    tree = ast.parse(APP.read_text())
    bare = [node.lineno for node in tree.body[1:] if isinstance(node, ast.Expr) and isinstance(node.value,
                                                                                              ast.Constant)]
    assert bare == []


# ------------------------------------------------------------------------------------------ a real browser


@pytest.fixture(scope="module")
def served(routed, tmp_path_factory) -> list:
    """`rcdiag dashboard` serves the routed run and a dense one (tests/dashboard/test_browser's server fixture)."""
    dense = write_run(tmp_path_factory.mktemp("dense") / "dense", pd.DataFrame(
        {"seq_id": [0, 0], "pos": [0, 1], "rollout_logprob": [-1.0, -0.5], "train_logprob": [-1.0, -0.6]}))
    return [routed, dense.path]


@pytest.mark.browser
def test_routing_page_in_chromium(server, page, routed):  # noqa: F811 (the imported fixtures)
    """Headless Chromium: the routed run's navigation lists Routing, its page draws both charts with the report's
    share and no stray text above the header; the dense run's navigation has no Routing entry."""
    summary = judge(open_run(routed)).routing.summary
    page.goto(f"{server}/routing?run=moe", timeout=120_000)
    settle(page, "Disagreement by layer")
    assert_no_exception(page)
    body = page.inner_text('[data-testid="stMain"]')
    assert body.lstrip().startswith("Routing · moe"), body[:300]
    assert f"{summary.explains.share:.0%}" in body and "|ℓ| by agreement" in body
    assert page.locator('[data-testid="stVegaLiteChart"]').count() == 2
    assert "Routing" in page.inner_text('[data-testid="stSidebarNav"]')
    page.goto(f"{server}/?run=dense", timeout=120_000)
    settle(page, "Overview")
    assert "Routing" not in page.inner_text('[data-testid="stSidebarNav"]')
