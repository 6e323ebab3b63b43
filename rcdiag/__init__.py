"""rcdiag: measure, understand and correct the training–inference log-prob mismatch of LLM RL, offline.

Public API (imported lazily, so `import rcdiag` stays cheap)::

    run = rcdiag.open_run("runs/sample")          # Run: .manifest, .tokens(), .sequences(), .iter_batches()
    rcdiag.compute_metrics(run)                   # dict of METRICS.md names
    rcdiag.simulate(run, "token_truncate", threshold=2.0)
    rcdiag.sweep(run)                             # DataFrame: IS metrics per mode × threshold
"""
from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_EXPORTS = {
    "open_run": "rcdiag.runstore",
    "Run": "rcdiag.runstore",
    "write_run": "rcdiag.runstore",
    "compute_metrics": "rcdiag.metrics",
    "simulate": "rcdiag.correction",
    "sweep": "rcdiag.correction",
    "CorrectionMode": "rcdiag.correction",
    "sequence_stats": "rcdiag.metrics",
    "analyze": "rcdiag.correction",
    "compare": "rcdiag.notebook",
    "import_run": "rcdiag.importers",
    "rescore_run": "rcdiag.rescore",
    "RescoreConfig": "rcdiag.rescore",
    "load_model": "rcdiag.scoring",
    "score_sequences": "rcdiag.scoring",
    "pad_to_batch": "rcdiag.packing",
    "unpad_from_batch": "rcdiag.packing",
    "InputError": "rcdiag.errors",
    "RunDirError": "rcdiag.errors",
    "RcdiagError": "rcdiag.errors",
}

__all__ = sorted(_EXPORTS) + ["__version__"]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'rcdiag' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
