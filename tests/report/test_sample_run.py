"""The README's main command on a real run: vLLM generation + transformers rescoring of the sample model, then
`rcdiag report RUN` writes all three outputs whose numbers equal the library's on the same data."""
from __future__ import annotations

import json

import pytest

import rcdiag
from rcdiag.cli import main

pytestmark = [pytest.mark.vllm, pytest.mark.model, pytest.mark.slow]


@pytest.fixture(scope="module")
def sample_run(vllm_engine, sample_model, tmp_path_factory):
    from rcdiag.score.generate import GenerateConfig, generate_run
    from rcdiag.score.rescore import RescoreConfig, rescore_run
    from tests.fixtures.engine import ENGINE_KWARGS

    out = tmp_path_factory.mktemp("sample") / "run"
    config = GenerateConfig(**{**ENGINE_KWARGS, "n": 2, "limit": 6, "max_tokens": 24})
    generate_run(sample_model, "sample_data/prompts.jsonl", out, config, llm=vllm_engine, silent=True)
    rescore_run(out, RescoreConfig(train_dtype="float32"), silent=True)
    return rcdiag.open_run(out)


def test_report_on_sample_run(sample_run, capsys):
    code = main(["report", str(sample_run.path), "--quiet"])
    assert code == 0, capsys.readouterr().err
    out = sample_run.path / "report"
    assert {"report.md", "report.html", "metrics.json"} <= {p.name for p in out.iterdir()}
    data = json.loads((out / "metrics.json").read_text())
    want = rcdiag.compute_metrics(sample_run)
    for name, value in data["metrics"].items():
        assert value == pytest.approx(want[name], rel=1e-12, abs=1e-15, nan_ok=True), name
    tis = rcdiag.simulate(sample_run, "token_truncate", threshold=2.0)
    assert data["is_modes"]["token_truncate"]["ess"] == pytest.approx(tis["ess"], rel=1e-12)
    severities = {c["name"]: c["severity"] for c in data["checks"]}
    # float32 engine vs float32 trainer at the same temperature: aligned, no placeholder, no convention defect
    for name in ("count_mismatch", "alignment_shift", "placeholders", "temperature", "truncation_offset"):
        assert severities[name] in ("ok", "info"), (name, data["checks"])
    assert data["counts"]["sequences"] == 12
    # the worst tokens are decoded with the run's own tokenizer, in context
    assert data["worst_tokens"] and all("⟦" in w["context"] and "token_text" in w for w in data["worst_tokens"])
    # ... through tokenizer.json (no transformers import), with the text transformers' AutoTokenizer gives
    from rcdiag.tokenizers import run_tokenizer

    reference = run_tokenizer(sample_run.manifest)
    for w in data["worst_tokens"]:
        assert w["token_text"] == reference.decode([w["token_id"]], skip_special_tokens=False)
