"""The IS defaults every part reads (report, checks, bootstrap, scan, dashboard, notebook): defined once, here.

A light module (no numba, no pandas) so that checks and the CLI can read them without loading the kernels.
"""
from __future__ import annotations

DEFAULT_THRESHOLD = 2.0
"""The IS threshold C. 2.0 is the default of verl v0.9.0 (`algorithm.rollout_correction.rollout_is_threshold`),
ms-swift v4.5.2 (`--rollout_importance_sampling_threshold`) and slime (`--tis-clip`). TRL v1.9.0 differs: its
`vllm_importance_sampling_clip_max` defaults to 3.0, with mode `sequence_mask` (GRPOConfig). rcdiag keeps 2.0 — the
majority default, and the stricter cap, so the report errs towards showing what a correction would remove; TRL's 3.0
is always in the sweep (DEFAULT_THRESHOLDS) and `simulate(run, "sequence_mask", 3.0, convention="trl")` gives TRL's
default setting."""
DEFAULT_THRESHOLDS = (1.1, 1.25, 1.5, 2.0, 3.0, 5.0, 10.0)
"""The thresholds of the report's sweep."""
IS_MODE_TABLE: dict[str, tuple[str, str, str | None]] = {
    "token_truncate": ("token", "truncate", None),
    "token_mask": ("token", "mask", None),
    "sequence_truncate": ("sequence", "truncate", None),
    "sequence_mask": ("sequence", "mask", None),
}
"""THE IS mode presets: name → (level, action, default lower bound: None, or "reciprocal" for L = 1/C).
rcdiag.analysis.correction.modes builds its presets from this table (get_mode, MODES), and the report, its CLI and the
dashboard name them from here before the kernels are loaded: adding a mode is one row (docs/recipes.md)."""
IS_MODES = tuple(IS_MODE_TABLE)
"""The preset names, in table order (the report's sweep)."""
DEFAULT_REPLICATES = 1000
"""Bootstrap replicates of the report's intervals."""
DEFAULT_LEVEL = 0.95
"""Confidence level of the bootstrap intervals."""
