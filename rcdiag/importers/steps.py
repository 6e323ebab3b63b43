"""The training step of a per-step dump from its file name, for dumps whose rows do not carry it themselves.

verl writes `rollout_data_dir/{step}.jsonl`, slime `--save-debug-rollout-data …/{rollout_id}.pt`, TRL
`completions_{step:05d}.parquet`: the trailing number of the file's stem is the step. A row's own step field wins.
"""
from __future__ import annotations

import re
from pathlib import Path

_TRAILING_NUMBER = re.compile(r"(\d+)$")


def step_from_name(file: str | Path) -> int | None:
    """The trailing integer of the file's stem ('12.jsonl' → 12, 'completions_00010.parquet' → 10, 'rollout.pt' →
    None)."""
    match = _TRAILING_NUMBER.search(Path(file).stem)
    return int(match.group(1)) if match else None
