"""Generic JSONL/Parquet importer: flat rows written with pandas, OpenAI-compatible and SGLang response shapes."""
from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from rcdiag.errors import InputError
from rcdiag.importers import ImportOptions, import_run
from tests.importers.dumps import assert_run_matches, make_truth

Q = ImportOptions(quiet=True)


def _frame(truth, names=("prompt_ids", "response_ids", "rollout_logprobs", "train_logprobs", "loss_mask")):
    return pd.DataFrame({
        names[0]: [t.prompt for t in truth], names[1]: [t.response for t in truth],
        names[2]: [t.rollout.tolist() for t in truth], names[3]: [t.train.tolist() for t in truth],
        names[4]: [t.mask.tolist() for t in truth], "reward": [t.reward for t in truth],
        "step": [5] * len(truth), "prompt": [f"p{i}" for i in range(len(truth))],
    })


def test_jsonl_common_names(tmp_path):
    truth = make_truth(seed=30)
    _frame(truth).to_json(tmp_path / "r.jsonl", orient="records", lines=True)
    run, imported = import_run("jsonl", tmp_path / "r.jsonl", tmp_path / "run", Q)
    assert_run_matches(run, truth)
    conv = run.manifest["source"]["conventions"]
    assert (conv["response_ids_field"], conv["mask_field"], conv["train_logprobs_field"]) == (
        "response_ids", "loss_mask", "train_logprobs")
    seqs = run.sequences()
    assert seqs["reward"].tolist() == [t.reward for t in truth] and seqs["step"].tolist() == [5] * len(truth)
    assert seqs["prompt_text"].tolist()[:2] == ["p0", "p1"]


def test_parquet_with_flags(tmp_path):
    """Unusual names given by the flags; a decoy field with a common name must not be picked."""
    truth = make_truth(seed=31)
    frame = _frame(truth, ("p_ids", "ids", "vllm_lp", "fsdp_lp", "cm"))
    frame["logprobs"] = [[0.0] * 3 for _ in truth]  # decoy: a common name with the wrong content
    frame.to_parquet(tmp_path / "r.parquet")
    opts = ImportOptions(quiet=True, response_ids_field="ids", rollout_logprobs_field="vllm_lp",
                         train_logprobs_field="fsdp_lp", mask_field="cm", prompt_ids_field="p_ids")
    run, _ = import_run("parquet", tmp_path / "r.parquet", tmp_path / "run", opts)
    assert_run_matches(run, truth)


def test_directory_of_jsonl_rollout_only(tmp_path):
    truth = make_truth(seed=32)
    frame = _frame(truth).drop(columns=["train_logprobs"])
    frame.iloc[:3].to_json(tmp_path / "a.jsonl", orient="records", lines=True)
    frame.iloc[3:].to_json(tmp_path / "b.jsonl", orient="records", lines=True)
    run, imported = import_run("jsonl", tmp_path, tmp_path / "run", Q)
    assert_run_matches(run, truth, train=False)
    assert any(item.startswith("trainer logprobs") for item in imported.lacks)  # the Next line says how


def _openai_row(t, *, as_ids: bool, k: int = 0):
    content = [{"token": f"token_id:{tok}" if not as_ids else f"t{tok}", "logprob": float(lp),
                "bytes": [1], "top_logprobs": []} for tok, lp in zip(t.response, t.rollout, strict=True)]
    choice = {"index": k, "text": "x", "finish_reason": "stop", "logprobs": {"content": content}}
    if as_ids:
        choice["token_ids"] = t.response
    return choice


def test_openai_content_shape(tmp_path):
    """Chat-completions `logprobs.content[]`: ids from `token_ids` or from `token_id:N` strings; n=2 choices."""
    truth = make_truth(seed=33, n=6)
    lines = []
    for i in range(0, 6, 2):
        choices = [_openai_row(truth[i], as_ids=True, k=0), _openai_row(truth[i + 1], as_ids=False, k=1)]
        lines.append(json.dumps({"id": f"req{i}", "choices": choices, "prompt_token_ids": truth[i].prompt}))
    (tmp_path / "r.jsonl").write_text("\n".join(lines) + "\n")
    run, imported = import_run("jsonl", tmp_path / "r.jsonl", tmp_path / "run", Q)
    assert_run_matches(run, truth, train=False, mask=False, prompts=False)
    assert run.sequences()["sample_index"].tolist() == [0, 1] * 3
    assert "raw_logprobs" in run.manifest["source"]["conventions"]["rollout_logprobs"]


def test_openai_legacy_completions_and_text_only_error(tmp_path):
    truth = make_truth(seed=34, n=2)
    rows = [{"choices": [{"index": 0, "text": "x", "token_ids": t.response,
                          "logprobs": {"tokens": ["a"] * len(t.response), "token_logprobs": t.rollout.tolist()}}]}
            for t in truth]
    pd.DataFrame({"choices": [r["choices"] for r in rows]}).to_json(tmp_path / "c.jsonl", orient="records",
                                                                    lines=True)
    run, _ = import_run("jsonl", tmp_path / "c.jsonl", tmp_path / "run", Q)
    assert_run_matches(run, truth, train=False, mask=False, prompts=False)
    bad = {"choices": [{"index": 0, "logprobs": {"content": [{"token": "hi", "logprob": -0.1}]}}]}
    (tmp_path / "t.jsonl").write_text(json.dumps(bad) + "\n")
    with pytest.raises(InputError, match="no token ids.*return_token_ids"):
        import_run("jsonl", tmp_path / "t.jsonl", tmp_path / "run2", Q)


def test_sglang_meta_info(tmp_path):
    truth = make_truth(seed=35)
    rows = [{"text": "x", "meta_info": {"id": f"r{i}", "finish_reason": {"type": "length"},
                                        "output_token_logprobs": [[float(lp), tok, None] for tok, lp in
                                                                  zip(t.response, t.rollout, strict=True)]}}
            for i, t in enumerate(truth)]
    (tmp_path / "s.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    run, _ = import_run("jsonl", tmp_path / "s.jsonl", tmp_path / "run", Q)
    assert_run_matches(run, truth, train=False, mask=False, prompts=False)
    assert run.sequences()["finish_reason"].tolist() == ["length"] * len(truth)
    assert "sglang#2664" in run.manifest["source"]["conventions"]["rollout_logprobs"]


def test_none_logprob_becomes_nan_and_is_warned(tmp_path):
    """JSON cannot hold NaN: vLLM writes None (trl#6693). It is kept as NaN and surfaced, never masked."""
    truth = make_truth(seed=36, n=2)
    frame = _frame(truth)
    frame.at[0, "rollout_logprobs"] = [None] + frame.at[0, "rollout_logprobs"][1:]
    frame.to_json(tmp_path / "r.jsonl", orient="records", lines=True)
    run, imported = import_run("jsonl", tmp_path / "r.jsonl", tmp_path / "run", Q)
    assert np.isnan(run.tokens()["rollout_logprob"].iloc[0]) and bool(run.tokens()["mask"].iloc[0])
    assert any("rollout_logprobs is nan" in w for w in imported.warnings)


def _write(tmp_path, rows):
    (tmp_path / "r.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return tmp_path / "r.jsonl"


@pytest.mark.parametrize(("rows", "opts", "message", "row", "field"), [
    ([{"response_ids": [1, 2], "logprobs": [-1.0, -2.0, -3.0]}], {}, r"\+1 pattern", 0, "rollout logprobs"),
    ([{"response_ids": [1, 2], "logprobs": [-1.0, -2.0]}, {"response_ids": [1, 2, 3], "logprobs": [-1.0] * 7}],
     {}, r"2n\+1 pattern", 1, "rollout logprobs"),
    ([{"response_ids": [1, 2], "logprobs": [-1.0, -2.0]}, {"response_ids": [1]}], {}, "missing field", 1,
     "logprobs"),
    ([{"ids": [1, 2]}], {}, "no token-id field found", 0, None),
    ([{"response_ids": [1, 2]}], {"mask_field": "mask"}, "--mask-field mask: no such field", 0, "mask"),
    ([{"response_ids": [1, 2], "logprobs": "oops"}], {}, "expected a list, got str", 0, "logprobs"),
    ([{"response_ids": [1, 2], "logprobs": [[-1.0], [-2.0]]}], {}, "not a flat list", 0, "logprobs"),
    ([{"response_ids": [1, 2], "logprobs": [-1.0], "prompt_ids": [5, 6]}], {}, r"-1 pattern", 0,
     "rollout logprobs"),
])
def test_bad_rows(tmp_path, rows, opts, message, row, field):
    file = _write(tmp_path, rows)
    with pytest.raises(InputError, match=message) as info:
        import_run("jsonl", file, tmp_path / "run", ImportOptions(quiet=True, **opts))
    assert (info.value.file, info.value.row, info.value.field) == (str(file), row + 1, field)  # rows from 1
    assert not (tmp_path / "run").exists() and not list(tmp_path.glob(".run*"))


def test_bad_json_and_bad_parquet(tmp_path):
    (tmp_path / "r.jsonl").write_text('{"response_ids": [1], "logprobs": [-1.0]}\n{"response_ids": [1\n')
    with pytest.raises(InputError, match=r"row 2: invalid JSON"):
        import_run("jsonl", tmp_path / "r.jsonl", tmp_path / "run", Q)
    (tmp_path / "r.parquet").write_text("not parquet")
    with pytest.raises(InputError, match="not a readable Parquet file"):
        import_run("parquet", tmp_path / "r.parquet", tmp_path / "run", Q)
    (tmp_path / "e.jsonl").write_text("")
    with pytest.raises(InputError, match="holds no samples"):
        import_run("jsonl", tmp_path / "e.jsonl", tmp_path / "run", Q)


def test_zero_on_valid_position_is_warned(tmp_path):
    """A 0.0 rollout logprob on a valid token (OpenRLHF turns None into 0.0) is reported, not silently kept."""
    truth = make_truth(seed=37, n=3)
    frame = _frame(truth)
    frame.at[0, "rollout_logprobs"] = [0.0] + frame.at[0, "rollout_logprobs"][1:]
    frame.to_json(tmp_path / "r.jsonl", orient="records", lines=True)
    run, imported = import_run("jsonl", tmp_path / "r.jsonl", tmp_path / "run", Q)
    assert run.manifest["source"]["mask_counts"]["zero_rollout_logprobs_valid"] == 1
    assert any(w.startswith("1 valid token(s) have a rollout logprob of exactly 0.0") for w in imported.warnings)


def test_openai_batch_output_lines(tmp_path):
    """`vllm run_batch` output: {custom_id, response: {status_code, body: {choices…}}}; custom_id names the prompt."""
    truth = make_truth(seed=38, n=3)
    lines = [{"id": f"b{i}", "custom_id": f"req-{i}", "error": None,
              "response": {"status_code": 200, "request_id": f"r{i}",
                           "body": {"id": "cmpl", "choices": [_openai_row(t, as_ids=True)]}}}
             for i, t in enumerate(truth)]
    (tmp_path / "out.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    run, _ = import_run("jsonl", tmp_path / "out.jsonl", tmp_path / "run", Q)
    assert_run_matches(run, truth, train=False, mask=False, prompts=False)
    assert run.sequences()["prompt_id"].tolist() == ["req-0", "req-1", "req-2"]
