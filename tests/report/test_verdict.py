"""The verdict-first report on three runs built here (healthy dense-like, heavy-tailed MoE-like, a temperature
bug): verdicts, the recommendation's class, its numbers against rcdiag.simulate, the settings to paste,
--fail-on, metrics.json, no duplicated rows, and escaping of data strings."""
from __future__ import annotations

import json
import re

import pytest

import rcdiag
from rcdiag.analysis.verdict.health import ALARM, HEALTHY, UNKNOWN, WARNING
from rcdiag.analysis.verdict.judge import verdict
from rcdiag.cli import main
from rcdiag.report.make import make_report
from rcdiag.report.options import ReportOptions
from rcdiag.report.render import Block, md_escape, to_html, to_markdown
from tests.report.verdict_runs import verdict_runs

FAST = ReportOptions(replicates=40)


@pytest.fixture(scope="module")
def reports(tmp_path_factory):
    root = tmp_path_factory.mktemp("verdict")
    runs = verdict_runs(root / "runs")
    out = {}
    for name, run in runs.items():
        result = make_report([run], root / "reports" / name, FAST)
        out[name] = (run, result.reports[0], result.out)
    return out


def test_verdicts(reports):
    healthy = reports["healthy"][1].verdict
    assert healthy.status == HEALTHY and healthy.cause.kind == "floor" and healthy.correct
    assert healthy.reasons[0].startswith("noise scale σ̂ = 0.03")  # its size against the bf16 floor
    heavy = reports["heavy"][1].verdict
    assert heavy.status == ALARM and heavy.cause.kind == "heavy_tail" and heavy.correct
    assert heavy.cause.title.startswith("heavy-tailed mismatch: 1.9")
    assert any(r.startswith("chi2_token = ") for r in heavy.reasons)
    assert any(r.startswith("frac_outside_0.5_2 = 0.019") for r in heavy.reasons)
    assert heavy.metric_status["abs_log_ratio_mean"] == WARNING  # the tail, not the bulk, is off the floor
    temp = reports["temperature"][1].verdict
    assert temp.status == ALARM and not temp.correct
    assert temp.first_check == "temperature" and temp.reasons[0].startswith("check temperature: the rollout")
    assert not any("floor" in r for r in temp.reasons)  # behind a failed check the numbers measure the defect


def test_recommendation_classes(reports):
    healthy = reports["healthy"][1].recommendation.to_dict()
    assert healthy["kind"] == "none" and healthy["text"].startswith("No correction needed: numerical mismatch at")
    assert "ESS" in healthy["text"] and "bias" in healthy["text"] and healthy["mode"] is None
    heavy = reports["heavy"][1].recommendation.to_dict()
    assert heavy["kind"] == "correct" and heavy["clipped_frac"] > 0.01  # it acts on the 1.9 % tail
    assert heavy["mode"].startswith("token") and heavy["threshold"] <= 2
    assert "sequence_truncate" not in heavy["text"].split(".")[0]
    temp = reports["temperature"][1].recommendation.to_dict()
    assert temp["kind"] == "fix_check" and temp["text"].startswith("Fix the failed check temperature first")
    assert temp["mode"] is None and temp["settings"] == []


def test_recommended_numbers_equal_simulate(reports):
    run, rep, _ = reports["heavy"]
    rec = rep.recommendation.to_dict()
    want = rcdiag.simulate(run, rec["mode"], threshold=rec["threshold"], convention=rep.options.convention)
    for key in ("ess", "clipped_frac", "is_weight_mean", "kept_token_frac", "kept_seq_frac"):
        assert rec[key] == pytest.approx(want[key], rel=1e-12, abs=1e-15), key
    assert rec["bias"] == pytest.approx(abs(want["is_weight_mean"] - 1), rel=1e-12)


def test_no_recommended_setting_clips_nothing_while_the_tail_is_heavy(reports):
    rec = reports["heavy"][1].recommendation.to_dict()
    assert rec["clipped_frac"] > 0 and rec["beyond_share"] == pytest.approx(0.019, abs=0.001)


def test_settings_to_paste_for_every_framework(reports):
    md = (reports["heavy"][2] / "report.md").read_text()
    html = (reports["heavy"][2] / "report.html").read_text()
    for text in ("algorithm.rollout_correction.rollout_is=token", "algorithm.rollout_correction.rollout_is_threshold=2",
                 "vllm_importance_sampling_mode=\"token_truncate\"", "vllm_importance_sampling_clip_max=2",
                 "--rollout_importance_sampling_mode token_truncate", "--rollout_importance_sampling_threshold 2",
                 "--use-tis --tis-clip 2"):
        assert text in md, text
    for framework in ("verl", "TRL", "ms-swift", "slime"):
        assert f"<div class=\"head\">{framework}" in html
    assert "0.10.0.dev" in md and "1.10.0.dev0" in md and "4.6.0.dev0" in md and "0.3.1" in md


def test_report_opens_with_the_verdict(reports):
    for name, status in (("healthy", "HEALTHY"), ("heavy", "ALARM")):
        md = (reports[name][2] / "report.md").read_text().splitlines()
        assert md[0].startswith("# rcdiag report") and md[2].startswith("*engine synthetic (bfloat16, T=1")
        assert md[4].startswith(f"> **{status}: ")
        html = (reports[name][2] / "report.html").read_text()
        assert f'data-status="{status.lower()}"' in html
        assert html.index("data-status") < html.index("<h2")
    assert "input checks pass" in (reports["heavy"][2] / "report.md").read_text()


def test_metrics_json_has_the_verdict(reports):
    data = json.loads((reports["heavy"][2] / "metrics.json").read_text())
    assert data["verdict"]["status"] == "alarm" and data["verdict"]["reasons"]
    assert data["verdict"]["metric_status"]["chi2_token"] == "alarm"
    assert data["verdict"]["metric_status"]["ess"] == "warning"  # 0.98: below the dense 0.99
    assert data["recommendation"]["kind"] == "correct" and len(data["recommendation"]["settings"]) == 4
    assert data["context"]["engine"]["logprobs_mode"] == "processed_logprobs"


def test_healthy_report_has_no_duplicated_table_rows(reports):
    md = (reports["healthy"][2] / "report.md").read_text()
    lines = md.splitlines()
    rows = [line for line, nxt in zip(lines, lines[1:] + [""], strict=True)
            if line.startswith("| ") and not nxt.startswith(("|:", "|-"))]  # data rows, not headers
    assert rows and len(rows) == len(set(rows))
    assert "identical numbers for every mode" in md  # the sweep's identical thresholds are merged
    assert "| kl |" not in md.split("## Where the mismatch comes from")[1].split("</details>")[0]


@pytest.mark.parametrize("name,level,code", [("healthy", "warning", 0), ("heavy", "alarm", 1),
                                             ("heavy", "warning", 1), ("temperature", "warning", 1)])
def test_fail_on(reports, tmp_path, capsys, name, level, code):
    run = reports[name][0]
    got = main(["report", str(run.path), "--out", str(tmp_path / "r"), "--quiet", "--fail-on", level])
    err = capsys.readouterr().err
    assert got == code, err
    if code:
        assert f"--fail-on {level}:" in err and f"{name}: " in err


def test_fail_on_rejects_unknown_level(reports, tmp_path, capsys):
    """A usage error like the other bad options (test_cli): exit 2, before any work."""
    out = tmp_path / "r"
    assert main(["report", str(reports["healthy"][0].path), "--out", str(out), "--fail-on", "bad"]) == 2
    assert "Error: Invalid value: --fail-on 'bad': choose one of warning, alarm" in capsys.readouterr().err
    assert not out.exists()


def test_cli_summary_line_is_the_verdict(reports, tmp_path, capsys):
    assert main(["report", str(reports["heavy"][0].path), "--out", str(tmp_path / "r")]) == 0
    first = capsys.readouterr().out.splitlines()[0]
    assert re.match(r"heavy: ALARM: heavy-tailed mismatch: 1\.9\d% of tokens .* — correct with token_truncate at C=2 "
                    r"\(kl=.*; input checks pass\)", first), first


def test_verdict_from_check_dicts_and_values():
    v = verdict({"kl": 0.05, "ess": 0.2}, [{"name": "placeholders", "severity": "warning", "message": "m"}])
    assert v.status == ALARM and v.cause.kind == "bands"
    assert v.reasons[0].startswith("ess = 0.2 (alarm") and v.reasons[1].startswith("kl = 0.05 (warning")
    assert v.reasons[2] == ("warning: placeholder or impossible log-probs on valid positions (input check "
                            "placeholders)")
    assert verdict({"kl": float("nan")}).status == UNKNOWN  # no data is not "no mismatch"


def test_data_strings_are_escaped():
    evil = "x | <script>alert(1)</script> [l](http://e) *b* _i_"
    md = to_markdown([Block("p", evil), Block("table", headers=["t"], rows=[[evil]])])
    assert "<script>" not in md and "[l](http" not in md and "| <" not in md and " *b* " not in md
    assert md_escape("a|b") == "a\\|b" and md_escape("token_truncate") == "token_truncate"
    page = to_html([Block("p", evil), Block("table", headers=["t"], rows=[[evil]])], {}, evil)
    assert "<script>" not in page and "&lt;script&gt;" in page


def test_notebook_card_shows_the_verdict_and_context(reports):
    from rcdiag import notebook

    run = notebook.Run(reports["heavy"][0].path) if hasattr(notebook, "Run") else reports["heavy"][0]
    card = notebook.run_html(run)
    assert 'data-status="alarm"' in card and "engine synthetic (bfloat16, T=1" in card
    assert "heavy-tailed mismatch" in card and "chi2_token = 38.4" in card and "What to do:" in card


def test_recommendation_is_typed_and_round_trips(reports):
    """The Recommendation the report makes is one typed object: its phrase is what the headline and the CLI line
    say, and metrics.json's dict reads back into the same object."""
    from rcdiag.report.recommend import Recommendation

    heavy = reports["heavy"][1].recommendation
    assert isinstance(heavy, Recommendation) and heavy.kind == "correct"
    assert heavy.phrase == f" — correct with {heavy.mode} at C={heavy.threshold:g}"
    assert Recommendation.from_dict(heavy.to_dict()) == heavy
    data = json.loads((reports["heavy"][2] / "metrics.json").read_text())["recommendation"]
    assert data == json.loads(json.dumps(heavy.to_dict(), default=str))
    assert reports["healthy"][1].recommendation.phrase == "" and reports["healthy"][1].recommendation.settings
