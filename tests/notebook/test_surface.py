"""What a notebook user meets first (issue #17): tab completion lists the public API only, tokens without a mask
column are announced, `run.sequence(id)` reads only the shard that holds it and decodes without transformers,
and progress bars never need ipywidgets."""
from __future__ import annotations

import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest

import rcdiag
from rcdiag.notebook import MaskWarning
from rcdiag.progress import bar_class, progress
from tests.fixtures.runs import build_run

ROOT = Path(__file__).resolve().parents[2]


def test_dir_lists_the_public_api_only():
    names = dir(rcdiag)
    assert {"open_run", "write_run", "compute_metrics", "simulate", "sweep", "__version__"} <= set(names)
    assert names == sorted(rcdiag.__all__) or set(names) == set(rcdiag.__all__)
    for internal in ("store", "analysis", "checks", "lazy", "cli", "notebook", "progress", "lazy_face"):
        assert internal not in names, internal
    for name in names:
        assert getattr(rcdiag, name) is not None, name


def test_tokens_without_mask_warn_once_per_write(tmp_path):
    frame = pd.DataFrame({"seq_id": [0, 0, 1], "pos": [0, 1, 0], "rollout_logprob": [-1.0, -2.0, -0.5],
                          "train_logprob": [-1.1, -2.0, -0.4]})
    with pytest.warns(MaskWarning, match="every row counts as a valid response token") as caught:
        run = rcdiag.write_run(tmp_path / "a", frame)
    assert len(caught) == 1 and run.tokens()["mask"].all()
    with warnings.catch_warnings():
        warnings.simplefilter("error", MaskWarning)
        rcdiag.write_run(tmp_path / "b", frame.assign(mask=[True, False, True]))


def test_sequence_reads_only_the_shard_that_holds_it(tmp_path, monkeypatch):
    run = build_run(tmp_path / "run", n_seq=60, shard_tokens=300)
    assert len(run.token_files) >= 4
    tokens = run.tokens()
    seq_id = int(tokens["seq_id"].iloc[-1])
    read = []
    real = pq.read_table
    monkeypatch.setattr(pq, "read_table", lambda f, *a, **k: read.append(Path(f).name) or real(f, *a, **k))
    view = run.sequence(seq_id)
    assert len(read) == 1, read
    want = tokens[tokens["seq_id"] == seq_id]
    np.testing.assert_array_equal(view.frame["pos"].to_numpy(), want["pos"].to_numpy())
    np.testing.assert_allclose(view.frame["log_ratio"].to_numpy(),
                               (want["train_logprob"].astype(float) - want["rollout_logprob"].astype(float)).to_numpy())


def test_sequence_text_decodes_without_importing_transformers(tmp_path):
    """The first run.sequence(id) took 17 s, almost all of it importing transformers to decode ~500 tokens."""
    model = ROOT / "sample_data" / "tiny-model"
    build_run(tmp_path / "run", n_seq=8, manifest={"tokenizer": {"path": str(model)}})
    code = (f"import sys, rcdiag; view = rcdiag.open_run({str(tmp_path / 'run')!r}).sequence(0); "
            "print('transformers' in sys.modules, repr(''.join(view.frame.text)[:20]))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120,
                         env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"})
    assert out.returncode == 0, out.stderr
    loaded, text = out.stdout.split(" ", 1)
    assert loaded == "False" and "⟨" not in text, out.stdout


def test_bars_outside_jupyter_are_plain_text_and_silent_twin_hides(monkeypatch):
    """Outside Jupyter a text bar: the live one on a terminal, the one-line-when-done LogBar in a log (pytest's
    captured stderr is not a terminal)."""
    import io

    from tqdm.std import tqdm as text_tqdm

    from rcdiag.progress import LogBar

    assert bar_class() is LogBar and issubclass(LogBar, text_tqdm)

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    monkeypatch.setattr("sys.stderr", Terminal())
    assert bar_class() is text_tqdm
    with progress(total=3, desc="x", silent=True) as bar:
        bar.update(3)
    assert bar.disable
