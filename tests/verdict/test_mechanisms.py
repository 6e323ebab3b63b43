"""The verdict on runs users bring (tests/fixtures/mechanisms.py): one run per mechanism, written with the full
context a scored run records and as an import writes it (no architecture, no dtypes, no sampling settings). Each
run's first report line is pinned, and the cause it names, whether a correction is advised, and that the report,
metrics.json and the CLI line say the same.

Guards issue #44: a chat-template mismatch and a batching bug got "ALARM: heavy-tailed … correct with token_truncate
at C=2" on imports; an fp8 engine got no correction; a recorded top-k read as a temperature bug; a one-step-off
async run was sent to hunt kernels; a long-context position effect read HEALTHY; a tiny clean run got a heavy-tail
warning; "at the bfloat16 floor" for a run below it.
"""
from __future__ import annotations

import json

import pytest

from rcdiag.cli import main
from rcdiag.report.make import make_report
from rcdiag.report.options import ReportOptions
from rcdiag.report.render import md_escape
from tests.fixtures.mechanisms import MECHANISMS, build_mechanism

FAST = ReportOptions(replicates=40, silent=True)
BUGS = ("prompt_mismatch", "few_sequences", "not_numerics", "input_defect", "input_warning")
"""Causes under which a correction would hide the cause: never pasted."""

# (mechanism, context): (first report line, cause kind, recommendation kind, recommended mode)
EXPECTED = {
    ("chat_template", "full"): ("ALARM: not numerical mismatch: the first response tokens of the sequences disagree "
                                "and the gap fades with position — the two sides saw different prompts",
                                "prompt_mismatch", "fix_cause", None),
    ("chat_template", "import"): ("ALARM: not numerical mismatch: the first response tokens of the sequences "
                                  "disagree and the gap fades with position — the two sides saw different prompts",
                                  "prompt_mismatch", "fix_cause", None),
    ("batching_bug", "full"): ("ALARM: not numerical mismatch: 8 of 400 sequences hold 66% of the mismatch",
                               "few_sequences", "fix_cause", None),
    ("batching_bug", "import"): ("ALARM: not numerical mismatch: 8 of 400 sequences hold 66% of the mismatch",
                                 "few_sequences", "fix_cause", None),
    ("fp8_engine", "full"): ("WARNING: numerical mismatch at the fp8-quantized floor, large enough to bias training: "
                             "mean |ℓ| 0.0811 (each token's weight off by ~8%)", "material_floor", "correct",
                             "token_truncate"),
    ("fp8_engine", "import"): ("WARNING: numerical mismatch above the bfloat16 floor: σ̂ 0.16 is ×2.6 its typical "
                               "0.064", "above_floor", "correct", "token_truncate"),
    ("top_k", "full"): ("WARNING: the engine renormalised over a top-p/top-k support (input check truncation_offset)",
                        "input_warning", "fix_cause", None),
    ("top_k", "import"): ("WARNING: the engine renormalised over a top-p/top-k support (input check "
                          "truncation_offset)", "input_warning", "fix_cause", None),
    ("top_p", "full"): ("WARNING: the engine renormalised over a top-p/top-k support (input check truncation_offset)",
                        "input_warning", "fix_cause", None),
    ("top_p", "import"): ("WARNING: the engine renormalised over a top-p/top-k support (input check "
                          "truncation_offset)", "input_warning", "fix_cause", None),
    ("top_p_noisy", "full"): ("WARNING: the engine renormalised over a top-p/top-k support (input check "
                              "truncation_offset)", "input_warning", "fix_cause", None),
    ("top_p_noisy", "import"): ("WARNING: the engine renormalised over a top-p/top-k support (input check "
                                "truncation_offset)", "input_warning", "fix_cause", None),
    ("one_step_off", "full"): ("WARNING: staleness: every sample is 1 step behind the trainer (no on-policy sample)",
                               "staleness", "correct", "token_truncate"),
    ("one_step_off", "import"): ("WARNING: staleness: every sample is 1 step behind the trainer (no on-policy "
                                 "sample)", "staleness", "correct", "token_truncate"),
    ("long_context", "full"): ("WARNING: numerical mismatch that grows with position: above the bfloat16 floor from "
                               "position 1,536 on", "position_onset", "none", None),
    ("long_context", "import"): ("WARNING: numerical mismatch that grows with position: above the bfloat16 floor "
                                 "from position 2,304 on", "position_onset", "none", None),
    ("tiny_clean", "full"): ("HEALTHY: numerical mismatch at or below the bfloat16 floor (mean |ℓ| 0.0028 ≤ 0.048)",
                             "floor", "none", None),
    ("tiny_clean", "import"): ("HEALTHY: numerical mismatch at or below the bfloat16 floor (mean |ℓ| 0.0028 ≤ "
                               "0.068)", "floor", "none", None),
    ("moe_flips", "full"): ("ALARM: heavy-tailed mismatch: 2.78% of tokens lie beyond 10× the run's noise scale "
                            "(worst |ℓ| 5.5)", "heavy_tail", "correct", "token_truncate"),
    ("moe_flips", "import"): ("ALARM: heavy-tailed mismatch: 2.78% of tokens lie beyond 10× the run's noise scale "
                              "(worst |ℓ| 5.5)", "heavy_tail", "correct", "token_truncate"),
    ("dense_floor", "full"): ("HEALTHY: numerical mismatch at or below the bfloat16 floor (mean |ℓ| 0.0154 ≤ 0.047)",
                              "floor", "none", None),
    ("dense_floor", "import"): ("HEALTHY: numerical mismatch at or below the bfloat16 floor (mean |ℓ| 0.0154 ≤ "
                                "0.067)", "floor", "none", None),
    ("bit_exact", "full"): ("HEALTHY: bit-exact on-policy: all 8,311 tokens' log-probs are identical on both sides",
                            "bit_exact", "none", None),
    ("bit_exact", "import"): ("HEALTHY: bit-exact on-policy: all 8,311 tokens' log-probs are identical on both "
                              "sides", "bit_exact", "none", None),
}
assert {name for name, _ in EXPECTED} == set(MECHANISMS)

# other seeds, vocabularies and lengths: the cause must not depend on the draw (mechanism: overrides)
HELD_OUT = {
    "chat_template": {"seed": 11, "vocab": 1024, "min_len": 24, "max_len": 96},
    "batching_bug": {"seed": 12, "vocab": 256, "n_seq": 300},
    "fp8_engine": {"seed": 13, "vocab": 2048},
    "top_p": {"seed": 14, "vocab": 1024},
    "one_step_off": {"seed": 15, "vocab": 512},
    "long_context": {"seed": 16, "n_seq": 20},
    "tiny_clean": {"seed": 17, "vocab": 1024},
    "moe_flips": {"seed": 18, "vocab": 768},
    "dense_floor": {"seed": 19, "vocab": 2048, "max_len": 128},
}


@pytest.fixture(scope="module")
def reports(tmp_path_factory):
    root = tmp_path_factory.mktemp("mechanisms")
    out = {}
    for name, context in EXPECTED:
        run = build_mechanism(root / "runs" / f"{name}-{context}", name, context)
        result = make_report([run], root / "reports" / f"{name}-{context}", FAST)
        out[name, context] = (run, result.reports[0], result.out)
    return out


@pytest.mark.parametrize("key", list(EXPECTED), ids=[f"{n}-{c}" for n, c in EXPECTED])
def test_first_line_and_cause(reports, key):
    line, kind, rec_kind, mode = EXPECTED[key]
    _, report, _ = reports[key]
    v, rec = report.verdict, report.recommendation
    assert v.headline() == line, v.line()
    assert (v.cause.kind, rec.kind, rec.mode) == (kind, rec_kind, mode), rec.text
    assert v.cause.action and v.cause.source  # every judgment says what to do and where its rule comes from


@pytest.mark.parametrize("key", list(EXPECTED), ids=[f"{n}-{c}" for n, c in EXPECTED])
def test_no_correction_is_pasted_over_a_bug(reports, key):
    """Where the cause is a bug or a setting, no correction's settings are offered — in the recommendation, the
    report and metrics.json."""
    _, report, out = reports[key]
    rec = report.recommendation.to_dict()
    md = (out / "report.md").read_text()
    data = json.loads((out / "metrics.json").read_text())
    if report.verdict.cause.kind in BUGS:
        assert not report.verdict.correct
        assert rec["settings"] == [] and rec["mode"] is None
        assert "Settings to paste" not in md and "correct with" not in md.split("\n", 3)[0]
        assert data["recommendation"]["settings"] == []
    else:
        assert report.verdict.correct


@pytest.mark.parametrize("key", list(EXPECTED), ids=[f"{n}-{c}" for n, c in EXPECTED])
def test_every_surface_says_the_same(reports, key, capsys):
    """report.md's banner, report.html, metrics.json and the CLI's summary line name the same status and cause."""
    run, report, out = reports[key]
    v = report.verdict
    md = (out / "report.md").read_text()
    html = (out / "report.html").read_text()
    data = json.loads((out / "metrics.json").read_text())
    assert md_escape(v.headline()) in md
    assert f'data-status="{v.status}"' in html or v.status.upper() in html
    assert (data["verdict"]["status"], data["verdict"]["cause"]["kind"]) == (v.status, v.cause.kind)
    code = main(["report", str(run.path), "--out", str(out.parent / f"{key[0]}-{key[1]}-cli"), "--quiet"])
    assert code in (0, None)
    printed = capsys.readouterr().out
    assert v.headline().split(" — ")[0] in printed, printed


def test_one_ulp_off_is_not_bit_exact(tmp_path):
    """Bit-exact is certified only when every token is identical: one token one float32 ulp away is not (prime-rl's
    audit counts it as a bit mismatch), and the verdict then sizes the mismatch against the floor instead."""
    import numpy as np

    import rcdiag
    from tests.fixtures.mechanisms import full_manifest, mechanism_frames

    m = MECHANISMS["bit_exact"]
    tokens, sequences = mechanism_frames(m)
    b = tokens["rollout_logprob"].to_numpy(np.float32).copy()
    i = int(np.flatnonzero(b < -0.5)[0])
    b[i] = np.nextafter(b[i], np.float32(0))
    tokens["rollout_logprob"] = b
    run = rcdiag.write_run(tmp_path / "run", tokens, sequences, manifest=full_manifest(m))
    v = make_report([run], tmp_path / "report", FAST).reports[0].verdict
    assert v.cause.kind == "floor", v.line()
    assert f"{(len(b) - 1) / len(b):.1%} of tokens bit-identical" in v.line()


@pytest.mark.parametrize("name", list(HELD_OUT))
def test_held_out_draws_name_the_same_cause(tmp_path, name):
    """Another seed, vocabulary and length mix of each mechanism, written as an import: the same cause."""
    run = build_mechanism(tmp_path / "run", name, "import", **HELD_OUT[name])
    report = make_report([run], tmp_path / "report", FAST).reports[0]
    assert report.verdict.cause.kind == EXPECTED[name, "import"][1], report.verdict.line()
