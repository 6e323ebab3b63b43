"""What `rcdiag score` shows while it works (issue #17): phase lines, one rcdiag bar per stage that moves per
finished request (vLLM's own "Processed prompts" bar off), bars that count the response tokens the run holds, and
a closing summary with the next command. One small real-engine run (the shared engine), since the engine start
dominates its cost."""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from rcdiag.progress import Phases
from rcdiag.score.config import GenerateConfig, RescoreConfig
from rcdiag.score.generate import generate_run
from rcdiag.score.rescore import rescore_run
from rcdiag.score.run import ScoreResult
from rcdiag.store.run import open_run
from tests.fixtures.engine import ENGINE_KWARGS


@pytest.mark.vllm
@pytest.mark.model
def test_phases_bars_and_summary(tmp_path: Path, sample_model: Path, vllm_engine: Any,
                                 capsys: pytest.CaptureFixture) -> None:
    from rcdiag.score.sample import SAMPLE_PROMPTS

    out = tmp_path / "run"
    phases = Phases()
    config = GenerateConfig(**ENGINE_KWARGS, limit=3, n=2, max_tokens=8, shard_prompts=2)
    generate_run(sample_model, SAMPLE_PROMPTS, out, config, llm=vllm_engine, phases=phases)
    rescore_run(out, RescoreConfig(), phases=phases)
    err = capsys.readouterr().err
    responses = int(open_run(out).tokens(["seq_id"]).shape[0])

    assert "Processed prompts" not in err  # vLLM's own bar is off
    for phase in ("▸ loading prompts", "▸ starting vLLM engine", "▸ generating (6 sequences)",
                  "▸ loading training model", f"▸ rescoring ({responses:,} response tokens)"):
        assert phase in err, phase
    # one bar per stage: the generate bar counts the 6 requests across both shards (it moved per request: the
    # first shard's 4 requests are visible before the second shard's), the rescore bar the response tokens only
    assert re.search(r"generate: 100%\|[^|]*\| 6/6 ", err), err
    assert re.search(r"generate: +67%\|[^|]*\| 4/6 ", err), err
    assert re.search(rf"rescore: 100%\|[^|]*\| {responses}(\.0)?/{responses}(\.0)? ", err), err
    assert set(phases.seconds) >= {"generating", "rescoring", "loading training model"}

    result = ScoreResult(run=out, info=open_run(out).info, seconds=phases.seconds)
    lines = result.summary_lines()
    assert lines[0] == f"Done: 6 sequences, {responses:,} response tokens in 2 shard(s), generated and rescored."
    assert lines[1] == f"  run:  {out}" and lines[2].startswith("  time: loading prompts ")
    assert lines[-1] == f"Next: rcdiag report {out}"


@pytest.mark.parametrize(("source", "engine", "trainer", "done", "quiet"), [
    ("generated", {"name": "vllm"}, {"name": "transformers", "model": "/m"}, "generated and rescored", "generated + rescored"),
    ("generated", {"name": "vllm"}, None, "generated, not rescored yet", "generated"),
    ("imported:verl", {"name": "vllm"}, {"name": "transformers", "model": "/m"}, "imported from verl and rescored",
     "imported from verl + rescored"),
    ("imported:slime", {"name": "vllm", "replayed": True}, {"name": "transformers", "model": "/m"},
     "imported from slime, replayed in the engine and rescored",
     "imported from slime + replayed in the engine + rescored"),
])
def test_summary_names_the_stages_the_manifest_records(source: str, engine: dict, trainer: dict | None,
                                                       done: str, quiet: str) -> None:
    """Guards a summary that claims a generation that never ran: `--rescore-only` on an imported dump, or
    `--rescore-both`, says where the rows came from and what touched them, read from the manifest."""
    from rcdiag.store.manifest import Manifest, new_manifest

    raw = new_manifest(source, engine=engine, counts={"sequences": 2, "tokens": 9, "shards": 1},
                       **({"trainer": trainer} if trainer else {}))
    result = ScoreResult(run=Path("r"), info=Manifest.of(raw))
    assert result.summary_lines()[0] == f"Done: 2 sequences, 9 response tokens in 1 shard(s), {done}."
    assert result.one_line() == f"r: 2 sequences, 9 tokens in 1 shard(s) ({quiet})"
