"""Routes in the run directory (rcdiag.store.routes): compact columns, read back exactly by rcdiag, DuckDB and
Polars, optional for dense runs, and refused with file/row/field when their count or ids are wrong."""
from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rcdiag.errors import InputError, RunDirError
from rcdiag.store.routes import (
    RoutingInfo,
    check_shard,
    confidence_from_probs,
    read_routes,
    route_array,
    routing_info,
)
from rcdiag.store.run import open_run
from rcdiag.store.writer import write_run
from tests.moe.routed_runs import MoESpec, write_moe_run

INFO = RoutingInfo(layers=4, top_k=2, experts=8)


@pytest.fixture(scope="module")
def moe_run(tmp_path_factory):
    return write_moe_run(tmp_path_factory.mktemp("moe") / "run", MoESpec(n_seq=12))


def test_round_trip_exact(moe_run) -> None:
    """Guards a layout slip (layer-major flattening, int16 narrowing, probabilities reordered): every token's
    [L, k] ids and [L, k+1] probabilities read back exactly as written, in token-row order."""
    path, seqs = moe_run
    run = open_run(path)
    info = routing_info(run.manifest)
    assert info == RoutingInfo(4, 2, 8, "prefill_replay", "rescored")
    rows = read_routes(run.path, run.token_files, info)
    assert np.array_equal(rows.routes["engine"], np.concatenate([s["engine_ids"] for s in seqs]))
    assert np.array_equal(rows.routes["trainer"], np.concatenate([s["train_ids"] for s in seqs]))
    assert np.allclose(rows.probs["engine"], np.concatenate([s["engine_p"] for s in seqs]), atol=1e-7)
    schema = pq.read_schema(run.token_files[0])
    assert schema.field("engine_routes").type == pa.list_(pa.int16())
    assert schema.field("train_route_probs").type == pa.list_(pa.float32())
    prompt = run.sequence_table(["engine_prompt_routes"]).column(0).to_pylist()
    assert prompt[0] == seqs[0]["prompt_routes"].reshape(-1).tolist()


def test_margin_from_probabilities() -> None:
    """The stored probabilities give the k/(k+1) logit margin exactly: softmax keeps logit differences."""
    z = np.array([[[2.0, 0.5, -1.0, 0.25]]])
    p = np.exp(z) / np.exp(z).sum()
    mass, margin = confidence_from_probs(np.array([[[p[0, 0, 0], p[0, 0, 1], p[0, 0, 3]]]]), 2)
    assert margin[0, 0] == pytest.approx(0.25) and mass[0, 0] == pytest.approx(p[0, 0, 0] + p[0, 0, 1])


def test_duckdb_and_polars_read_them(moe_run) -> None:
    """Guards a column only rcdiag can read: DuckDB and Polars see SMALLINT lists of L·k ids per token."""
    import duckdb
    import polars as pl

    path, seqs = moe_run
    glob = str(path / "tokens" / "*.parquet")
    n, width, first = duckdb.sql(f"SELECT count(*), min(len(engine_routes)), first(engine_routes ORDER BY seq_id, "
                                 f"pos) FROM '{glob}'").fetchall()[0]
    assert n == sum(s["tokens"].size for s in seqs) and width == 8
    assert first == seqs[0]["engine_ids"][0].reshape(-1).tolist()
    frame = pl.read_parquet(glob)
    assert frame.schema["train_routes"] == pl.List(pl.Int16)
    assert frame["train_routes"][0].to_list() == seqs[0]["train_ids"][0].reshape(-1).tolist()


def test_dense_run_unchanged(tmp_path) -> None:
    """Guards routes leaking into dense runs: no route column, no routing section, the columns a run always had."""
    import pandas as pd

    run = write_run(tmp_path / "dense", pd.DataFrame({"seq_id": [0, 0], "pos": [0, 1],
                                                      "rollout_logprob": [-0.1, -0.2]}))
    assert routing_info(run.manifest) is None
    assert "engine_routes" not in pq.read_schema(run.token_files[0]).names
    assert list(run.tokens().columns) == ["seq_id", "pos", "token_id", "rollout_logprob", "train_logprob",
                                          "train_entropy", "mask"]


def _damage(path, file: str, name: str, row: int, value) -> None:
    table = pq.read_table(path / file)
    values = table.column(name).to_pylist()
    values[row] = value
    index = table.schema.get_field_index(name)
    pq.write_table(table.set_column(index, table.schema.field(name), pa.array(values, table.schema.field(name).type)),
                   path / file)


def test_wrong_count_and_bad_id_refused(tmp_path) -> None:
    """Guards routes that do not pair with their tokens: a row with one layer missing (6 ids for 4 layers × 2) and
    an id ≥ num_experts are refused naming the file, the row (from 1) and the column."""
    path, _ = write_moe_run(tmp_path / "a", MoESpec(n_seq=3))
    _damage(path, "tokens/part-00000.parquet", "engine_routes", 4, [1, 2, 3, 4, 5, 6])
    run = open_run(path)
    with pytest.raises(InputError) as err:
        read_routes(run.path, run.token_files, routing_info(run.manifest))
    assert err.value.row == 5 and err.value.field == "engine_routes" and "part-00000" in str(err.value)
    assert "route count must equal the token count" in str(err.value)
    path, _ = write_moe_run(tmp_path / "b", MoESpec(n_seq=3))
    _damage(path, "tokens/part-00000.parquet", "train_routes", 2, [0, 1, 2, 3, 4, 5, 6, 8])
    run = open_run(path)
    with pytest.raises(InputError, match=r"expert id 8 is outside \[0, 8\)") as err:
        read_routes(run.path, run.token_files, routing_info(run.manifest))
    assert err.value.row == 3 and err.value.field == "train_routes"


def test_prompt_routes_checked_against_prompt_length(tmp_path) -> None:
    """Guards prompt routes of the wrong length: (P−1)·L·k ids, checked against the sequence's prompt_len."""
    path, _ = write_moe_run(tmp_path / "a", MoESpec(n_seq=3))
    _damage(path, "sequences/part-00000.parquet", "engine_prompt_routes", 1, [0] * 8)
    tokens, sequences = (pq.read_table(path / d / "part-00000.parquet") for d in ("tokens", "sequences"))
    with pytest.raises(InputError) as err:
        check_shard(tokens, sequences, INFO, source=f"{path}/tokens/part-00000.parquet")
    assert err.value.row == 2 and err.value.field == "engine_prompt_routes" and "sequences" in err.value.file


def test_packing_refuses_wrong_shape_and_ids() -> None:
    """Guards silent truncation when routes are packed: int16 narrowing never wraps an id, shapes are checked."""
    with pytest.raises(InputError, match="expected \\[tokens, 4, 2\\]"):
        route_array(np.zeros((3, 4, 3), int), INFO, source="x", field="engine_routes")
    with pytest.raises(InputError, match="expert id 70000") as err:
        route_array(np.full((2, 4, 2), 70000), INFO, source="x", field="engine_routes")
    assert err.value.row == 1


def test_malformed_routing_section_refused(tmp_path) -> None:
    """Guards a manifest whose routing section cannot describe routes (top_k 0, experts ≤ top_k, unknown side)."""
    for bad in ({"layers": 4, "top_k": 0}, {"layers": 4, "top_k": 2, "experts": 2},
                {"layers": 4, "top_k": 2, "engine": "guessed"}, [1, 2]):
        with pytest.raises(RunDirError, match="routing"):
            routing_info({"routing": bad})


def test_float_routes_refused_at_the_door(tmp_path) -> None:
    """Guards expert ids stored as floats: the door check refuses the column's type, naming it."""
    path, _ = write_moe_run(tmp_path / "a", MoESpec(n_seq=2))
    file = path / "tokens/part-00000.parquet"
    table = pq.read_table(file)
    index = table.schema.get_field_index("engine_routes")
    table = table.set_column(index, "engine_routes", table.column(index).cast(pa.list_(pa.float32())))
    pq.write_table(table, file)
    with pytest.raises(InputError, match="list of integers") as err:
        open_run(path)
    assert err.value.field == "engine_routes"
    assert json.loads((path / "manifest.json").read_text())["routing"]["layers"] == 4
