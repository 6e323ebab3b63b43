"""Where a run's probes live (RUN/probes/<name>.parquet + <name>.json) and how they are written and found."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa

from rcdiag.store.files import write_json_atomic, write_parquet_atomic

PROBES_DIR = "probes"


def write_probe(run_path: Path, name: str, frame: pd.DataFrame, summary: dict[str, Any]) -> list[Path]:
    """RUN/probes/<name>.parquet then <name>.json (the JSON last: a probe with a JSON is complete)."""
    directory = Path(run_path) / PROBES_DIR
    directory.mkdir(exist_ok=True)
    table = pa.Table.from_pandas(frame, preserve_index=False)
    parquet, summary_file = directory / f"{name}.parquet", directory / f"{name}.json"
    write_parquet_atomic(table, parquet)
    write_json_atomic(summary_file, summary)
    return [parquet, summary_file]


def list_probes(run_path: str | os.PathLike) -> list[Path]:
    """Summary files of the complete probes of a run (newest last); [] when there is none."""
    directory = Path(run_path) / PROBES_DIR
    files = [f for f in directory.glob("*.json") if not f.name.startswith(".")] if directory.is_dir() else []
    return sorted(files, key=lambda f: f.stat().st_mtime)
