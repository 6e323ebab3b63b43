"""A run damaged inside its Parquet files (mask stored as strings, a duplicated sequence row) is a readable message
on every dashboard page, from the same door check as `rcdiag report` — not Streamlit's "Internal error"."""
from __future__ import annotations

import shutil

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from app.text import plain
from tests.dashboard.test_errors import PAGES


@pytest.fixture(scope="module")
def damaged(synthetic_runs, tmp_path_factory):
    root = tmp_path_factory.mktemp("damaged")
    mask, dup = root / "mask", root / "dup"
    shutil.copytree(synthetic_runs["clean"].path, mask)
    shutil.copytree(synthetic_runs["clean"].path, dup)
    file = mask / "tokens" / "part-00000.parquet"
    table = pq.read_table(file)
    pq.write_table(table.set_column(table.schema.get_field_index("mask"), "mask",
                                    pc.cast(table["mask"], pa.string())), file)
    file = dup / "sequences" / "part-00000.parquet"
    table = pq.read_table(file)
    pq.write_table(pa.concat_tables([table, table.slice(0, 1)]), file)
    return {"mask": (mask, "field 'mask': wrong dtype string"), "dup": (dup, "seq_id 0 appears twice")}


@pytest.mark.parametrize("case", ["mask", "dup"])
@pytest.mark.parametrize("page", PAGES)
def test_damaged_run_is_a_message(make_app, damaged, case, page):
    path, text = damaged[case]
    app = make_app(path, page=page)
    assert not app.exception, [e.value for e in app.exception]
    assert app.error and text in plain(app.error[0].value), [e.value for e in app.error]  # shown escaped
    assert "Traceback" not in app.error[0].value
