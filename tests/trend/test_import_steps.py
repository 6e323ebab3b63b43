"""Importers of per-step dump directories fill `step` from the file name when the rows do not carry it (verl
`rollout_data_dir/{step}.jsonl`, slime `{rollout_id}.pt` without a rollout_id), so a trend has its steps."""
from __future__ import annotations

import json

import pytest
import torch

from rcdiag.importers import ImportOptions, import_run
from rcdiag.importers.steps import step_from_name
from tests.importers.dumps import make_truth, slime_sample, train_tokenizer


@pytest.mark.parametrize(("name", "step"), [("12.jsonl", 12), ("completions_00010.parquet", 10),
                                            ("rollout_data/7.pt", 7), ("rollout.pt", None), ("12a.jsonl", None)])
def test_step_from_name(name, step):
    assert step_from_name(name) == step


def test_verl_text_lines_without_step(tmp_path):
    tokenizer = train_tokenizer(tmp_path / "tok")
    dumps = tmp_path / "rollout_data_dir"
    dumps.mkdir()
    for step in (3, 5):
        (dumps / f"{step}.jsonl").write_text("".join(json.dumps({"input": f"question {i}", "output": "it is 42",
                                                                   "score": 1.0}) + "\n" for i in range(2)))
    run, _ = import_run("verl-text", dumps, tmp_path / "run", ImportOptions(quiet=True, tokenizer=str(tokenizer)))
    assert run.sequences()["step"].tolist() == [3, 3, 5, 5]


def test_slime_dumps_without_rollout_id(tmp_path):
    for step, seed in ((2, 0), (4, 1)):
        truth = make_truth(seed=seed)
        path = tmp_path / "dd" / f"{step}.pt"
        path.parent.mkdir(parents=True, exist_ok=True)
        torch.save({"samples": [slime_sample(t, i // 2) for i, t in enumerate(truth)]}, path)
    run, _ = import_run("slime", tmp_path / "dd", tmp_path / "run", ImportOptions(allow_pickle=True, quiet=True))
    steps = run.sequences()["step"]
    assert sorted(set(steps)) == [2, 4]
    assert steps.value_counts().to_dict() == {2: 7, 4: 7}
