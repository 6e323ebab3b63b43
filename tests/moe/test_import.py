"""Imported MoE routes round-trip from fixtures shaped like each framework's real dump (rcdiag.importers.routes):

- slime / miles: `Sample.to_dict()["rollout_routed_experts"]`, int32 `[len(tokens) − 1, layers, top_k]`
  (slime/rollout/sglang_rollout.py), saved with torch.save;
- verl: the batch's `routed_experts` `[B, P_pad + R_pad, layers, top_k]` int16, the engine's rows placed from the
  left-padded prompt's first token (verl's agent loop: `start_pos = P_pad − len(prompt_ids)`), zeros elsewhere;
- SGLang: `meta_info.routed_experts`, base64 of int32 `[P + n − 1 − routed_experts_start_len, layers, top_k]`.

Each token row of the run must hold the route row of the position that predicts it (P − 1 + t) and the sequence the
prompt positions' rows; a dump whose routes do not cover every token is refused with `Error:` naming the file, the
row and the field (through the CLI), never a reshape traceback.
"""
from __future__ import annotations

import base64
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from rcdiag.cli import main
from rcdiag.importers import import_run
from rcdiag.importers.common import ImportOptions
from rcdiag.store.routes import PROMPT_ROUTES, read_routes, routing_info
from tests.importers.dumps import make_truth, save_slime_rollout, slime_sample, verl_tensors

LAYERS, TOP_K, EXPERTS = 4, 2, 8
MODEL = Path(__file__).resolve().parents[2] / "sample_data" / "tiny-moe"
"""The MoE sample model: its config.json (4 layers, top-2 of 8) gives SGLang's buffer its shape."""


def route_rows(truth, seed: int = 1) -> list[np.ndarray]:
    """Per sample, one row of distinct expert ids per position that predicts a token: [P + n − 1, L, k]."""
    rng = np.random.default_rng(seed)
    return [np.stack([np.stack([rng.choice(EXPERTS, TOP_K, replace=False) for _ in range(LAYERS)])
                      for _ in range(len(t.prompt) + len(t.response) - 1)]).astype(np.int32) for t in truth]


def assert_routes(run, truth, rows, *, prompts: bool = True) -> None:
    """Token t of sample i holds rows[i][P − 1 + t]; the sequence holds rows[i][:P − 1]."""
    info = routing_info(run.manifest)
    assert (info.layers, info.top_k, info.engine) == (LAYERS, TOP_K, "imported")
    got = read_routes(run.path, run.token_files, info, sides=("engine",))
    expected = np.concatenate([r[len(t.prompt) - 1:len(t.prompt) - 1 + len(t.response)]
                               for t, r in zip(truth, rows, strict=True)])
    assert got.routes["engine"].shape == expected.shape and (got.routes["engine"] == expected).all()
    seqs = run.sequences()
    if prompts:
        for (t, r), stored in zip(zip(truth, rows, strict=True), seqs[PROMPT_ROUTES], strict=True):
            assert list(stored) == r[:len(t.prompt) - 1].reshape(-1).tolist()


def _error(capsys, argv: list[str]) -> str:
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert any(line.startswith("Error:") for line in err.splitlines()) and "Traceback" not in err, err
    return err


# ------------------------------------------------------------------------------------------------ slime
def save_slime(path: Path, truth, rows, kind: str = "tensor") -> Path:
    """A rollout dump whose samples carry rollout_routed_experts as an int32 torch tensor (slime's sglang_rollout
    `torch.tensor(...).reshape(len(tokens) − 1, num_layers, moe_router_topk)`) or as nested lists (the dataclass's
    `list[list[int]]`). slime versions that keep a numpy array pickle it, under torch.save's protocol 2, through
    `_codecs.encode`, which the safe loader does not load yet (reported to the loader's owner)."""
    samples = []
    for i, (t, r) in enumerate(zip(truth, rows, strict=True)):
        sample = slime_sample(t, i // 2)
        sample["rollout_routed_experts"] = torch.from_numpy(r) if kind == "tensor" else r.tolist()
        samples.append(sample)
    torch.save({"rollout_id": 3, "samples": samples}, path)
    return path


@pytest.mark.parametrize("kind", ["tensor", "list"])
def test_slime_routes_round_trip(tmp_path, kind):
    """slime's rollout_routed_experts → engine_routes per token and engine_prompt_routes per sample, the
    manifest's routing section; then `rcdiag report` shows the Routing section (engine side only)."""
    truth = make_truth(n=6)
    rows = route_rows(truth)
    dump = save_slime(tmp_path / "rollout.pt", truth, rows, kind)
    run, _ = import_run("slime", dump, tmp_path / "run", ImportOptions(allow_pickle=True))
    assert_routes(run, truth, rows)
    assert main(["report", str(run.path), "--quiet", "--out", str(tmp_path / "rep")]) == 0
    md = (tmp_path / "rep" / "report.md").read_text()
    assert "## Routing (mixture of experts)" in md and "Only the engine side's routes" in md


def test_slime_missing_rows_are_null_and_a_dump_without_routes_has_none(tmp_path):
    """A row of −1 (the missing-route sentinel) is a null route for that token; a plain dense dump imports with
    no route column and no routing section."""
    truth = make_truth(n=4)
    rows = route_rows(truth)
    p = len(truth[0].prompt)
    rows[0][p - 1 + 1] = -1  # sample 0, response token 1
    run, _ = import_run("slime", save_slime(tmp_path / "r.pt", truth, rows), tmp_path / "run",
                        ImportOptions(allow_pickle=True))
    column = run.tokens()["engine_routes"]
    assert column.iloc[1] is None and column.iloc[0] is not None
    dense, _ = import_run("slime", save_slime_rollout(tmp_path / "dense.pt", truth), tmp_path / "dense",
                          ImportOptions(allow_pickle=True))
    assert routing_info(dense.manifest) is None and "engine_routes" not in dense.tokens().columns


def test_slime_route_count_must_equal_token_count(tmp_path, capsys):
    """One row short on the fourth sample: Error naming the dump, row 4 and rollout_routed_experts."""
    truth = make_truth(n=6)
    rows = route_rows(truth)
    rows[3] = rows[3][:-1]
    dump = save_slime(tmp_path / "short.pt", truth, rows)
    err = _error(capsys, ["import", "slime", str(dump), "--out", str(tmp_path / "run"), "--allow-pickle"])
    assert "short.pt" in err and "row 4" in err and "rollout_routed_experts" in err
    assert "route count must equal the token count" in err
    rows = route_rows(truth)
    rows[1][0, 2, 1] = -5
    err = _error(capsys, ["import", "slime", str(save_slime(tmp_path / "neg.pt", truth, rows)), "--out",
                          str(tmp_path / "run2"), "--allow-pickle"])
    assert "row 2" in err and "-5" in err


# ------------------------------------------------------------------------------------------------ verl
def save_verl_routes(path: Path, truth, rows, *, drop_last: int | None = None) -> Path:
    """verl's gen batch tensors plus routed_experts as its agent loop builds them (a dict of tensors, which
    `rcdiag import verl` reads like a DataProto's batch)."""
    tensors = verl_tensors(truth)
    p_pad = tensors["prompts"].shape[1]
    total = tensors["input_ids"].shape[1]
    routed = torch.zeros((len(truth), total, LAYERS, TOP_K), dtype=torch.int16)
    for i, (t, r) in enumerate(zip(truth, rows, strict=True)):
        start = p_pad - len(t.prompt)
        r = r[:-1] if i == drop_last else r
        routed[i, start:start + len(r)] = torch.from_numpy(r.astype(np.int16))
    tensors["routed_experts"] = routed
    torch.save(tensors, path)
    return path


def test_verl_routes_round_trip(tmp_path):
    """routed_experts [B, P_pad + R_pad, L, k] → the same per-token and prompt routes as the source rows."""
    truth = make_truth(n=6)
    rows = route_rows(truth, seed=2)
    run, _ = import_run("verl", save_verl_routes(tmp_path / "gen_batch.dp", truth, rows), tmp_path / "run",
                        ImportOptions(allow_pickle=True))
    assert_routes(run, truth, rows)


def test_verl_padding_where_a_route_should_be_is_refused(tmp_path, capsys):
    """The engine returned one row fewer for sample 1 (index 0): its last response token's row is zero padding —
    Error naming the file, row 1 and routed_experts."""
    truth = make_truth(n=6)
    rows = route_rows(truth, seed=2)
    dump = save_verl_routes(tmp_path / "gen_batch.dp", truth, rows, drop_last=0)
    err = _error(capsys, ["import", "verl", str(dump), "--out", str(tmp_path / "run"), "--allow-pickle"])
    assert "gen_batch.dp" in err and "row 1" in err and "routed_experts" in err and "padding" in err


# ------------------------------------------------------------------------------------------------ SGLang
def sglang_rows(truth, rows, start: int = 0) -> list[dict]:
    """SGLang /generate responses as the server returns them, routes base64 int32 from position `start`."""
    out = []
    for t, r in zip(truth, rows, strict=True):
        if not t.response:
            continue
        out.append({"text": "…", "output_ids": t.response, "meta_info": {
            "id": f"req-{t.index}", "prompt_tokens": len(t.prompt), "completion_tokens": len(t.response),
            "finish_reason": {"type": "stop"},
            "output_token_logprobs": [[float(lp), tok, None] for lp, tok in zip(t.rollout, t.response, strict=True)],
            "routed_experts": base64.b64encode(r[start:].astype("<i4").tobytes()).decode("ascii"),
            **({"routed_experts_start_len": start} if start else {})}})
    return out


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_sglang_routes_round_trip(tmp_path):
    """meta_info.routed_experts (shape from --tokenizer's config.json) → the source rows; with
    routed_experts_start_len the prompt's rows are not all there, so no prompt routes are stored."""
    truth = [t for t in make_truth(n=6) if t.response]
    rows = route_rows(truth, seed=3)
    file = write_jsonl(tmp_path / "responses.jsonl", sglang_rows(truth, rows))
    run, _ = import_run("sglang", file, tmp_path / "run", ImportOptions(tokenizer=str(MODEL)))
    assert_routes(run, truth, rows)
    assert routing_info(run.manifest).experts == EXPERTS
    start = min(len(t.prompt) for t in truth) - 1
    file = write_jsonl(tmp_path / "start.jsonl", sglang_rows(truth, rows, start=start))
    run, _ = import_run("sglang", file, tmp_path / "run2", ImportOptions(tokenizer=str(MODEL)))
    assert_routes(run, truth, rows, prompts=False)
    assert run.sequences()[PROMPT_ROUTES].isna().all()


def test_sglang_refusals_name_file_row_and_field(tmp_path, capsys):
    """Routes one position short, a buffer that is not whole rows of the model's shape, and no --tokenizer: each an
    Error naming the line and meta_info.routed_experts."""
    truth = [t for t in make_truth(n=6) if t.response]
    rows = route_rows(truth, seed=3)
    short = [r.copy() for r in rows]
    short[2] = short[2][:-1]
    file = write_jsonl(tmp_path / "short.jsonl", sglang_rows(truth, short))
    err = _error(capsys, ["import", "sglang", str(file), "--out", str(tmp_path / "a"), "--tokenizer", str(MODEL)])
    assert "short.jsonl" in err and "row 3" in err and "meta_info.routed_experts" in err
    assert "route count must equal the token count" in err
    bad = sglang_rows(truth, rows)
    bad[1]["meta_info"]["routed_experts"] = base64.b64encode(b"\x01\x00\x00\x00" * 3).decode()
    err = _error(capsys, ["import", "sglang", str(write_jsonl(tmp_path / "odd.jsonl", bad)), "--out",
                          str(tmp_path / "b"), "--tokenizer", str(MODEL)])
    assert "row 2" in err and "whole number of rows" in err
    err = _error(capsys, ["import", "sglang", str(write_jsonl(tmp_path / "ok.jsonl", sglang_rows(truth, rows))),
                          "--out", str(tmp_path / "c")])
    assert "--tokenizer MODEL_DIR" in err and "meta_info.routed_experts" in err


@pytest.mark.parametrize("fmt", ["slime", "verl", "sglang"])
def test_formats_are_listed(fmt):
    """Each route-carrying format is one `rcdiag import` knows."""
    from rcdiag.importers import FORMATS

    assert fmt in FORMATS
