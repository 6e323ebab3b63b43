"""Report files: all outputs present, self-contained HTML, atomic replacement, comparison of several runs."""
from __future__ import annotations

import json
import re

import pytest

from rcdiag.errors import ConfigError
from rcdiag.report.make import make_report
from rcdiag.report.options import ReportOptions
from rcdiag.report.outdir import MARKER, write_files
from rcdiag.report.render import fmt, plain

PNGS = {"l_histogram.png", "l_vs_rollout.png", "l_by_position.png", "sweep.png"}
FAST = ReportOptions(replicates=100)


@pytest.fixture(scope="module")
def clean_report(synthetic_runs, tmp_path_factory):
    return make_report([synthetic_runs["clean"]], tmp_path_factory.mktemp("rep") / "clean", FAST)


def test_all_outputs_written(clean_report):
    out = clean_report.out
    names = {p.name for p in out.iterdir()}
    assert names == {"report.md", "report.html", "metrics.json", MARKER} | PNGS
    for png in PNGS:
        assert (out / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    data = json.loads((out / "metrics.json").read_text())
    assert set(data) >= {"metrics", "is_modes", "sweep", "checks", "counts", "manifest", "tails", "strata",
                         "confidence_intervals", "recommendation", "rejection", "verdict", "context"}
    assert len(data["sweep"]) == 4 * 7 and set(data["is_modes"]) == {
        "token_truncate", "token_mask", "sequence_truncate", "sequence_mask"}
    assert [c["name"] for c in data["checks"]][:1] and all(c["severity"] == "ok" for c in data["checks"])
    assert data["confidence_intervals"]["kl"]["low"] < data["metrics"]["kl"] < data["confidence_intervals"]["kl"]["high"]


def test_default_out_is_run_report_dir(synthetic_runs, tmp_path):
    import shutil

    import rcdiag

    run = rcdiag.open_run(shutil.copytree(synthetic_runs["bf16"].path, tmp_path / "bf16"))
    result = make_report([run], options=FAST)
    assert result.out == run.path / "report" and (run.path / "report" / "metrics.json").is_file()


def test_html_is_self_contained(clean_report):
    page = (clean_report.out / "report.html").read_text()
    assert len(re.findall(r'<img alt="[^"]*" src="data:image/png;base64,', page)) == len(PNGS)
    assert not re.search(r'(src|href)="(https?:|//|[a-z_]+\.png)', page), "no external or relative resource"
    assert "<script" not in page
    assert (page.index('data-status="healthy"') < page.index('id="recommendation"') < page.index('id="headline"')
            < page.index('id="input-checks"'))


def test_markdown_links_pngs_and_states_recommendation(clean_report):
    md = (clean_report.out / "report.md").read_text()
    for png in PNGS:
        assert f"]({png})" in md
    assert md.index("> **HEALTHY") < md.index("## Recommendation") < md.index("## Headline") < md.index(
        "## Input checks")
    assert "> No correction needed: " in md


def test_replacing_a_report_is_atomic(tmp_path):
    """A failure half-way through writing (a real OSError: a file where a folder must go) leaves the previous
    report untouched and no temporary directory behind."""
    out = tmp_path / "rep"
    write_files(out, {"metrics.json": b"{}", "report.md": b"old"})
    with pytest.raises(OSError):
        write_files(out, {"report.md": b"new", "x": b"file", "x/y.png": b"cannot"})
    assert (out / "report.md").read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["rep"]


def test_refuses_to_replace_a_directory_that_is_not_a_report(clean_run, tmp_path):
    (tmp_path / "mine.txt").write_text("precious")
    with pytest.raises(ConfigError, match="not an rcdiag report directory"):
        make_report([clean_run], tmp_path, FAST)
    assert (tmp_path / "mine.txt").read_text() == "precious"


def test_comparison_of_two_runs(synthetic_runs, tmp_path):
    result = make_report([synthetic_runs["clean"], synthetic_runs["bf16"]], tmp_path / "cmp", FAST)
    out = result.out
    assert {"report.md", "report.html", "metrics.json"} <= {p.name for p in out.iterdir()}
    for name in ("clean", "bf16"):
        assert (out / "runs" / name / "report.html").is_file()
    data = json.loads((out / "metrics.json").read_text())
    assert data["comparison"] == ["clean", "bf16"]
    assert data["runs"]["bf16"]["metrics"]["kl"] == pytest.approx(result.reports[1].metrics["kl"])
    md = (out / "report.md").read_text()
    assert "[clean: full report](runs/clean/report.html) · [bf16: full report](runs/bf16/report.html)" in md
    assert '<a href="runs/bf16/report.html">' in (out / "report.html").read_text()
    assert "| metric | clean | bf16 |" in md
    row = next(line for line in md.splitlines() if line.startswith("| storage_precision |"))
    assert "ok" in row.split("|")[2] and "warning" in row.split("|")[3]


def test_same_named_runs_get_distinct_folders(synthetic_runs, tmp_path):
    import shutil

    import rcdiag

    a = rcdiag.open_run(shutil.copytree(synthetic_runs["clean"].path, tmp_path / "a" / "run"))
    b = rcdiag.open_run(shutil.copytree(synthetic_runs["top_p"].path, tmp_path / "b" / "run"))
    result = make_report([a, b], tmp_path / "cmp", FAST)
    assert sorted(p.name for p in (result.out / "runs").iterdir()) == ["run-a", "run-b"]


def test_run_named_dotdot_stays_inside_the_comparison(synthetic_runs, tmp_path):
    """A run opened as `<dir>/tokens/..` is named '..': its folder must not be the comparison's parent (#20)."""
    import rcdiag

    dotdot = rcdiag.open_run(synthetic_runs["clean"].path / "tokens" / "..")
    assert dotdot.name == ".."
    result = make_report([dotdot, synthetic_runs["bf16"]], tmp_path / "cmp", FAST)
    assert sorted(p.name for p in (result.out / "runs").iterdir()) == ["bf16", "run"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cmp"]


def test_fmt_and_plain():
    assert fmt(float("nan")) == "—" and fmt(None) == "—" and fmt(1234567) == "1,234,567"
    assert fmt(0.00012345) == "1.234e-04" and fmt(0.5) == "0.5"
    assert plain({"a": float("inf"), "b": (1, float("nan"))}) == {"a": None, "b": [1, None]}
