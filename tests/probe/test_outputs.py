"""The probe through its user-facing surfaces: CLI text and exit codes, refusals before any work, the report
section (md/html/json/figure) and the dashboard's Probes page — each checked against the stored summary."""
from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest

from rcdiag.cli import main
from rcdiag.errors import ConfigError, RunDirError
from rcdiag.probe.run import ProbeConfig, run_probe
from rcdiag.store.manifest import update_manifest
from rcdiag.store.run import Run, open_run

APP = Path(__file__).resolve().parents[2] / "app" / "dashboard.py"


@pytest.fixture(scope="module")
def cli_probe(probe_run: Run, tmp_path_factory: pytest.TempPathFactory) -> tuple[Run, str]:
    """A copy of the run probed through the CLI (so the report/dashboard tests see exactly one probe)."""
    path = tmp_path_factory.mktemp("cli") / "run"
    shutil.copytree(probe_run.path, path, ignore=shutil.ignore_patterns("probes"))
    return open_run(path), ""


def test_cli_probe_writes_files_and_prints_budget(cli_probe, capsys: pytest.CaptureFixture[str]) -> None:
    """The CLI prints the answer first, then the residual gap of each change (not shares over 100 %), with
    the overall [k/N] progress of the grid."""
    from rcdiag.probe.answer import probe_answer

    run, _ = cli_probe
    code = main(["probe", str(run.path), "--sample", "6", "--factors", "train_dtype,packing", "--name", "cli",
                 "--threads", "1"])
    out = capsys.readouterr().out
    assert code == 0, out
    summary = json.loads((run.path / "probes" / "cli.json").read_text())
    assert f"mean |ℓ| {summary['gap']['mean_abs']:.4g}" in out
    bf16 = next(r for r in summary["budget"] if r["setting"] == "train_bf16")
    assert f"{bf16['change']:<58} {bf16['residual_mean_abs']:>12.3g} {bf16['removes']:>8.1%}" in out
    assert out.index(probe_answer(summary).top_line) < out.index("if you change")
    assert "float32 packed_4096 vs alone: max |Δ| 0" in out
    assert (run.path / "probes" / "cli.parquet").is_file()


@pytest.mark.parametrize(("args", "message"), [
    (["--factors", "train_dtype,warp_speed"], "unknown factor(s) warp_speed"),
    (["--factors", "router_replya"], "unknown factor(s) router_replya (did you mean 'router_replay'"),
    (["--sample", "0"], "--sample must be ≥ 1"),
    (["--name", "../x"], "use a plain file name"),
])
def test_cli_refusals(cli_probe, capsys: pytest.CaptureFixture[str], args: list[str], message: str) -> None:
    """A bad option value is a usage error: exit 2, the usage line, the value named (with a guess for a typo),
    and no probe file written."""
    run, _ = cli_probe
    before = sorted((run.path / "probes").glob("*")) if (run.path / "probes").exists() else []
    assert main(["probe", str(run.path), *args]) == 2
    err = capsys.readouterr().err
    assert message in err and "Usage: rcdiag probe" in err and "Traceback" not in err
    assert (sorted((run.path / "probes").glob("*")) if (run.path / "probes").exists() else []) == before


def test_cli_help_has_examples(capsys: pytest.CaptureFixture[str]) -> None:
    main(["probe", "--help"])
    out = capsys.readouterr().out
    assert "rcdiag probe runs/sample --sample 64 --factors train_dtype,packing" in " ".join(out.split())
    assert "decode_vs_prefill" in out


def test_engine_factors_refused_before_work(probe_run: Run, tmp_path: Path) -> None:
    """An imported run whose engine model is not on disk: engine factors are refused up front, naming the fix."""
    path = tmp_path / "run"
    shutil.copytree(probe_run.path, path, ignore=shutil.ignore_patterns("probes"))
    model = str(probe_run.manifest["engine"]["model"])
    update_manifest(path, {"engine": {"model": str(tmp_path / "missing")}})
    with pytest.raises(ConfigError, match="--factors train_dtype,attention,packing,chunk"):
        run_probe(path, ProbeConfig(sample=2, factors=("decode_vs_prefill",), train_model=model), silent=True)
    assert not (path / "probes").exists()


def test_run_without_tokens_is_refused(probe_run: Run, tmp_path: Path) -> None:
    import pandas as pd

    from rcdiag.store.writer import write_run

    tokens = pd.DataFrame({"seq_id": pd.Series([], dtype="int64"), "pos": pd.Series([], dtype="int32"),
                           "rollout_logprob": pd.Series([], dtype="float32")})
    sequences = pd.DataFrame({"seq_id": [0, 1], "prompt_token_ids": [[1, 2], [3]]})
    empty = write_run(tmp_path / "empty", tokens, sequences, manifest={"engine": probe_run.manifest["engine"]})
    with pytest.raises(RunDirError, match="nothing to probe"):
        run_probe(empty.path, ProbeConfig(factors=("packing",)), silent=True)


def test_report_includes_probe(cli_probe, tmp_path: Path) -> None:
    """`rcdiag report` appends the latest probe: budget table + figure in md/html, the summary in metrics.json."""
    from rcdiag.report.make import make_report

    run, _ = cli_probe
    if not (run.path / "probes" / "cli.json").is_file():
        run_probe(run.path, ProbeConfig(sample=6, factors=("train_dtype", "packing"), name="cli"), silent=True)
    summary = json.loads((run.path / "probes" / "cli.json").read_text())
    result = make_report([run.path], tmp_path / "report")
    md = (result.out / "report.md").read_text()
    assert "Where the gap comes from (probe 'cli')" in md and "probe_budget.png" in md
    assert "| if you change | residual gap" in md
    assert (result.out / "probe_budget.png").read_bytes()[:4] == b"\x89PNG"
    data = json.loads((result.out / "metrics.json").read_text())
    assert data["probe"]["budget"] == summary["budget"]
    assert "Where the gap comes from" in (result.out / "report.html").read_text()
    assert data["probe_answer"]["top_line"].split(" (mean")[0] in md


def test_report_without_probe_is_unchanged(probe_run: Run, tmp_path: Path) -> None:
    from rcdiag.report.probe_section import probe_section

    path = tmp_path / "run"
    shutil.copytree(probe_run.path, path, ignore=shutil.ignore_patterns("probes"))
    assert probe_section(path) == ([], {}, {})


def test_dashboard_probes_page(cli_probe, monkeypatch: pytest.MonkeyPatch) -> None:
    from streamlit.testing.v1 import AppTest

    run, _ = cli_probe
    if not (run.path / "probes" / "cli.json").is_file():
        run_probe(run.path, ProbeConfig(sample=6, factors=("train_dtype", "packing"), name="cli"), silent=True)
    summary = json.loads((run.path / "probes" / "cli.json").read_text())
    monkeypatch.setattr(sys, "argv", [str(APP), str(run.path)])
    app = AppTest.from_file(str(APP), default_timeout=120)
    app.run()
    app.switch_page("views/probes.py").run()
    assert not app.exception and not app.error, [e.value for e in app.error]
    from app.text import md
    from rcdiag.probe.answer import probe_answer

    assert md(probe_answer(summary).top_line) in [m.value for m in app.success]  # the answer comes first
    residual = app.dataframe[0].value  # then the residual gaps, the most helpful change first
    rows = sorted((r for r in summary["budget"] if r["residual"] is not None), key=lambda r: r["residual"])
    assert residual["setting"].tolist() == [r["setting"] for r in rows]
    budget = app.dataframe[1].value  # the budget table
    assert budget["setting"].tolist() == [r["setting"] for r in summary["budget"]]
    assert budget["share"].tolist() == pytest.approx([r["share"] for r in summary["budget"]])
    assert any("decode" in i.value or md("packed_4096") in i.value for i in app.info)
