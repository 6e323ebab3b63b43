"""examples/analysis.ipynb: committed without outputs, and every cell runs (nbclient; a failing cell fails)."""
from __future__ import annotations

from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

from tests.fixtures.runs import build_run

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOK = ROOT / "examples" / "analysis.ipynb"


def test_committed_notebook_is_stripped():
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    nbformat.validate(notebook)
    code = [c for c in notebook.cells if c.cell_type == "code"]
    assert code, "the walk-through has code cells"
    for index, cell in enumerate(code):
        assert cell.outputs == [] and cell.execution_count is None, f"code cell {index} has stored outputs"


@pytest.mark.slow
def test_notebook_runs_end_to_end(tmp_path, monkeypatch):
    """On the real sample run when it exists, else on a synthetic run written with write_run."""
    sample = ROOT / "runs" / "sample"
    run_path = sample if (sample / "manifest.json").exists() else build_run(tmp_path / "sample", n_seq=30).path
    monkeypatch.setenv("RCDIAG_SAMPLE_RUN", str(run_path))
    monkeypatch.delenv("RCDIAG_OTHER_RUN", raising=False)
    monkeypatch.setenv("MPLBACKEND", "Agg")
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    NotebookClient(notebook, timeout=300, startup_timeout=240, kernel_name="python3",
                   resources={"metadata": {"path": str(tmp_path)}}).execute()
    outputs = [o for c in notebook.cells if c.cell_type == "code" for o in c.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    html = [o.data["text/html"] for o in outputs if "text/html" in o.get("data", {})]
    assert html[0].startswith("<div class='rcdiag'>") and f"Run {run_path.name}" in html[0]
    assert sum("image/png" in o.get("data", {}) for o in outputs) >= 6, "every plot cell shows a PNG"
    assert any("bf16_rollout" in h and "difference" in h for h in html), "the comparison table is shown"
    assert any("class='tok" in h for h in html), "the worst sequence is shown token by token"
