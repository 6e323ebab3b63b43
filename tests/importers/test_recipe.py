"""docs/recipes.md, "Add an importer", followed literally: a module with `read` and one FORMATS row give an
importer that writes runs, feeds the report and refuses bad input with its location — nothing else to touch."""
from __future__ import annotations

import json
import sys
import types
from pathlib import Path

import numpy as np
import pytest

from rcdiag import importers
from rcdiag.errors import InputError
from rcdiag.importers import import_run
from rcdiag.importers.common import Imported, ImportOptions, Record
from rcdiag.importers.values import number_list, token_id_list
from rcdiag.report.build import build_report
from rcdiag.report.options import ReportOptions


def toy_read(path: Path, opts: ImportOptions, fmt: str) -> Imported:
    """A toy format: one JSON object per line, {"ids": [...], "engine": [...], "trainer": [...]}."""
    records = []
    for row, line in enumerate(path.read_text().splitlines(), 1):
        obj = json.loads(line)
        where = (str(path), row)
        records.append(Record(response_ids=np.asarray(token_id_list(obj["ids"], where, "ids")),
                              rollout_logprobs=np.asarray(number_list(obj["engine"], where, "engine")),
                              train_logprobs=np.asarray(number_list(obj["trainer"], where, "trainer")),
                              step=obj.get("step"), where=where))
    return Imported(fmt, path, records, conventions={"rollout_logprobs": "engine", "train_logprobs": "trainer"})


@pytest.fixture
def toy(monkeypatch):
    module = types.ModuleType("rcdiag.importers.toy")
    module.read = toy_read
    monkeypatch.setitem(sys.modules, "rcdiag.importers.toy", module)
    monkeypatch.setitem(importers.FORMATS, "toy", ("toy", "a toy format (docs/recipes.md)"))


def test_an_importer_is_a_read_function_and_one_row(toy, tmp_path):
    rng = np.random.default_rng(0)
    lines = []
    for step in range(3):
        for _ in range(8):
            b = -rng.uniform(0.01, 3, 20)
            lines.append(json.dumps({"ids": rng.integers(0, 100, 20).tolist(), "engine": b.tolist(),
                                     "trainer": (b + rng.normal(0, 0.01, 20)).clip(None, -1e-4).tolist(),
                                     "step": step}))
    (tmp_path / "dump.txt").write_text("\n".join(lines))
    run, imported = import_run("toy", tmp_path / "dump.txt", tmp_path / "run")
    assert run.num_tokens == 24 * 20 and imported.fmt == "toy"
    assert run.manifest["source"]["kind"] == "imported:toy" and run.manifest["measured"]["rollout"] == "sampled"
    report = build_report(run, ReportOptions(replicates=20))
    assert report.metrics["tokens"] == 480 and report.trend is not None and len(report.trend) == 3


def test_the_shared_checks_apply(toy, tmp_path):
    """A bad value in the toy format is the shared refusal with file, row and field."""
    (tmp_path / "bad.txt").write_text(json.dumps({"ids": [1, True], "engine": [-1.0, -2.0], "trainer": [-1, -2]}))
    with pytest.raises(InputError) as caught:
        import_run("toy", tmp_path / "bad.txt", tmp_path / "run")
    text = str(caught.value)
    assert "bad.txt" in text and "ids" in text and not (tmp_path / "run").exists()
