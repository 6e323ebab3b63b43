"""`rcdiag report` from the command line: pin the user-facing text, then verify through the API."""
from __future__ import annotations

import json

import pytest

import rcdiag
from rcdiag.cli import main
from rcdiag.report.gate import Condition, evaluate, parse


def _run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_help_shows_examples(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")  # rich wraps option help at the terminal width (80 without a TTY)
    code, out, _ = _run(capsys, "report", "--help")
    assert code == 0
    flat = " ".join(out.split())
    for text in ("rcdiag report runs/sample", "--fail-if \"k3_kl>1e-3\" --fail-if \"ess<0.9\"",
                 "rcdiag report runs/bf16 runs/fp16 --out reports/bf16-vs-fp16", "--convention", "--thresholds",
                 "else 2.0]", "canonical | swift | verl | trl"):
        assert text in flat, text


def test_report_then_api_agrees(synthetic_runs, tmp_path, capsys):
    run = synthetic_runs["temperature"]
    out = tmp_path / "rep"
    code, stdout, stderr = _run(capsys, "report", str(run.path), "--out", str(out), "--thresholds", "1.5,2,4",
                                "--convention", "verl")
    assert code == 0, stderr
    assert stdout.splitlines()[0].startswith("temperature: ALARM: fix the failed input check temperature first: the two "
                                             "sides use different temperatures (kl=0.02")
    assert stdout.splitlines()[1].startswith("  check temperature: the rollout log-probs are sharper: on ")
    assert stdout.strip().splitlines()[-2] == f"Wrote {out}/report.html, report.md, metrics.json"
    assert stdout.strip().splitlines()[-1].startswith(f"Next: open {out}/report.html")
    data = json.loads((out / "metrics.json").read_text())
    setting = data["options"].pop("is_setting")
    assert data["options"] == {"convention": "verl", "threshold": 2.0, "lower": None, "thresholds": [1.5, 2.0, 4.0],
                               "keys": "canonical"}
    assert (setting["mode"], setting["threshold"], setting["origin"]) == ("token_truncate", 2.0, "rcdiag")
    assert "no trainer settings recorded" in setting["why"]
    want = rcdiag.compute_metrics(rcdiag.open_run(run.path), convention="verl")
    assert data["metrics"]["k3_kl"] == pytest.approx(want["k3_kl"], rel=1e-12)
    assert sorted({row["threshold"] for row in data["sweep"]}) == [1.5, 2.0, 4.0]


def test_fail_if_exits_1_listing_failures(synthetic_runs, tmp_path, capsys):
    run = synthetic_runs["temperature"]
    code, stdout, stderr = _run(capsys, "report", str(run.path), "--out", str(tmp_path / "r"), "--quiet",
                                "--fail-if", "kl>1e-3", "--fail-if", "ess<0.9", "--fail-if", "chi2_token>1e6",
                                "--fail-if", "sequence_mask.kept_seq_frac<0.5")
    # --quiet keeps one line a run: the verdict, what a CI log needs (it printed nothing, issue #44)
    assert code == 1 and stdout.count("\n") == 1 and stdout.startswith("temperature: ALARM: fix the failed input")
    kl = rcdiag.compute_metrics(run)["kl"]
    ess = rcdiag.simulate(run, "token_truncate", threshold=2.0)["ess"]
    assert stderr == ("Failed --fail-if conditions:\n"
                      f"  temperature: kl = {kl:.6g} (kl>1e-3)\n"
                      f"  temperature: ess = {ess:.6g} (ess<0.9)\n")


def test_fail_if_passing_exits_0(clean_run, tmp_path, capsys):
    code, _, stderr = _run(capsys, "report", str(clean_run.path), "--out", str(tmp_path / "r"), "--quiet",
                           "--fail-if", "kl>1e-2", "--fail-if", "ess<0.9")
    assert code == 0 and stderr == ""


@pytest.mark.parametrize(("argv", "message"), [
    (["--fail-if", "kll>1"], "--fail-if 'kll>1': unknown metric 'kll' (did you mean 'kl'?); known: kl, k3_kl,"),
    (["--fail-if", "kl 1"], "--fail-if 'kl 1': expected NAME OP VALUE with OP in"),
    (["--fail-if", "kl>>1"], "--fail-if 'kl>>1': '>1' is not a number"),
    (["--fail-if", "kl>abc"], "--fail-if 'kl>abc': 'abc' is not a number"),
    (["--fail-if", "k3_kl>2x"], "--fail-if 'k3_kl>2x' is a ratio to a baseline run: add --baseline OTHER_RUN"),
    (["--fail-on", "alram"], "--fail-on 'alram': choose one of warning, alarm (did you mean 'alarm'?)"),
    (["--thresholds", "1.1,x"], "--thresholds '1.1,x': expected numbers separated by commas"),
    (["--thresholds", "0.5"], "thresholds must be finite numbers > 1, got 0.5"),
    (["--convention", "slime"], "unknown convention 'slime'; choose one of canonical, swift, verl, trl, openrlhf, "
                                "skyrl, nemo-rl, prime-rl, roll"),
    (["--lower", "3"], "--lower must lie in (0, 1.1) (below every threshold), got 3.0"),
])
def test_bad_options_are_usage_errors_before_any_work(clean_run, tmp_path, capsys, argv, message):
    """Exit 2 with the usage, never 1: a CI gate's exit 1 means "a condition holds", and a typo in it must not
    read as a mismatch (nor pass as exit 0)."""
    out = tmp_path / "never"
    code, _, stderr = _run(capsys, "report", str(clean_run.path), "--out", str(out), *argv)
    assert code == 2 and stderr.startswith("Usage: rcdiag report"), stderr
    assert f"Error: Invalid value: {message}" in stderr, stderr
    assert not out.exists()


def test_missing_run_directory(tmp_path, capsys):
    code, _, stderr = _run(capsys, "report", str(tmp_path / "nope"))
    assert code == 1 and stderr == f"Error: {tmp_path / 'nope'}: no such run directory\n"


@pytest.mark.parametrize("command", ["report", "dashboard"])
def test_a_dump_file_given_as_a_run_says_how_to_import_it(tmp_path, capsys, command):
    """A trainer's dump passed where a run directory is read is not 'no such run directory': it exists, and the
    error says what a run is and the import that makes one."""
    dump = tmp_path / "rollouts.jsonl"
    dump.write_text("{}\n")
    code, _, stderr = _run(capsys, command, str(dump))
    assert code == 1 and stderr.startswith(f"Error: {dump}: not a run directory (a run is a directory with "), stderr
    assert f"`rcdiag import FORMAT {dump} --out RUN`" in stderr and "no such" not in stderr


@pytest.mark.parametrize("command", ["report", "dashboard"])
def test_misspelt_run_directory_names_the_close_one(tmp_path, capsys, command):
    """A typo names the run beside it (runs holding a manifest come first), for every command taking runs."""
    for name in ("simple", "sample", "other"):
        (tmp_path / name).mkdir()
    (tmp_path / "sample" / "manifest.json").write_text("{}")
    code, _, stderr = _run(capsys, command, str(tmp_path / "smaple"))
    want = f"(did you mean {tmp_path / 'sample'} or {tmp_path / 'simple'}?)"
    assert code == 1 and stderr == f"Error: {tmp_path / 'smaple'}: no such run directory {want}\n", stderr


def test_conditions_hold_on_nan():
    """A metric that could not be computed fails its gate (no silent pass)."""
    cond = parse(" ess < 0.9 ")
    assert cond == Condition("ess < 0.9", "ess", "<", 0.9)
    assert evaluate([cond], {"ess": float("nan")}) == ["ess = nan (ess < 0.9)"]
    assert evaluate([parse("kl>=0.5")], {"kl": 0.5}) == ["kl = 0.5 (kl>=0.5)"]
    assert evaluate([parse("kl!=0.5")], {"kl": 0.5}) == []


def test_lower_bound_applies_where_the_convention_has_one(synthetic_runs, tmp_path, capsys):
    """verl bounds only its masks from below (IcePop's "L_C"): `--convention verl --lower 0.5` reports (it refused
    the whole report because token_truncate has no L under verl), L on the mask modes only, and says so; swift has
    no L anywhere: a usage error."""
    run = synthetic_runs["clean"]
    code, stdout, stderr = _run(capsys, "report", str(run.path), "--out", str(tmp_path / "rep"), "--convention", "verl",
                                "--lower", "0.5", "--quiet")
    assert code == 0, stderr
    md = (tmp_path / "rep" / "report.md").read_text()
    assert "lower L=0.5 (on token_mask, sequence_mask: verl bounds only those)" in md
    from rcdiag.analysis.correction.modes import lower_for

    assert lower_for("token_truncate", "verl", 0.5) is None and lower_for("token_mask", "verl", 0.5) == 0.5
    assert lower_for("token_truncate", "canonical", 0.5) == 0.5
    code, _, stderr = _run(capsys, "report", str(run.path), "--convention", "swift", "--lower", "0.5")
    assert code == 2 and "convention swift has no lower bound L in any mode" in stderr
