"""The report is SECTIONS folded: each section one builder (RunReport → Section | None) and one table row — adding
one is a function and a row, and its blocks, figure and metrics.json keys all land (docs/recipes.md)."""
from __future__ import annotations

import json

from rcdiag.report import sections
from rcdiag.report.make import make_report
from rcdiag.report.options import ReportOptions
from rcdiag.report.render import Block
from rcdiag.report.section import Section
from tests.fixtures.runs import build_run


def toy_section(report) -> Section:
    """A toy section: a heading, a sentence with a number of the report, a figure and a metrics.json key."""
    tokens = report.counts["tokens"]
    return Section([Block("h", "Toy section"), Block("p", f"this run has {tokens} valid tokens")],
                   {"toy.png": ("log_ratio_histogram", (report.scan.tails,))}, {"toy": {"tokens": tokens}})


def test_a_section_is_one_builder_and_one_row(tmp_path, monkeypatch):
    run = build_run(tmp_path / "run", n_seq=30)
    table = list(sections.SECTIONS)
    table.insert([name for name, _ in table].index("raw"), ("toy", toy_section))
    monkeypatch.setattr(sections, "SECTIONS", tuple(table))
    out = make_report([run], tmp_path / "rep", ReportOptions(replicates=20)).out
    md = (out / "report.md").read_text()
    tokens = json.loads((out / "metrics.json").read_text())["counts"]["tokens"]
    assert f"## Toy section\n\nthis run has {tokens} valid tokens" in md
    assert md.index("## Toy section") < md.index("## Raw numbers")  # where its row says
    assert (out / "toy.png").stat().st_size > 1000 and "Toy section" in (out / "report.html").read_text()
    assert json.loads((out / "metrics.json").read_text())["toy"] == {"tokens": tokens}


def test_sections_with_nothing_to_say_leave_no_trace(tmp_path):
    """A one-step run without a baseline, lag or probe: those builders give None (or data only), no heading."""
    run = build_run(tmp_path / "run", n_seq=30)
    out = make_report([run], tmp_path / "rep", ReportOptions(replicates=20)).out
    md = (out / "report.md").read_text()
    assert "## Across training" not in md and "Policy lag" not in md and "Against the baseline" not in md
    data = json.loads((out / "metrics.json").read_text())
    assert len(data["by_step"]) == 1 and "baseline" not in data
