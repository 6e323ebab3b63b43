"""rcdiag: measure, understand and correct the training–inference log-prob mismatch of LLM RL, offline.

Public API (imported lazily, so `import rcdiag` stays cheap)::

    run = rcdiag.open_run("runs/sample")          # Run: .manifest, .tokens(), .sequences(), .iter_batches()
    rcdiag.compute_metrics(run)                   # dict of docs/metrics.md names
    rcdiag.simulate(run, "token_truncate", threshold=2.0)
    rcdiag.sweep(run)                             # DataFrame: IS metrics per mode × threshold
    rcdiag.trend(run, convention="verl")          # DataFrame: every metric per training step, with intervals
    rcdiag.logged_values(run, "swift", unit="micro_batch", rank="rank")   # a framework's logged value per step
"""
from __future__ import annotations

from rcdiag.lazy import lazy_face

__version__ = "0.1.0"

_EXPORTS = {
    **dict.fromkeys(("open_run", "Run", "write_run", "compare"), "rcdiag.notebook"),
    **dict.fromkeys(("compute_metrics", "sequence_stats"), "rcdiag.analysis.metrics.compute"),
    **dict.fromkeys(("simulate", "sweep", "CorrectionMode"), "rcdiag.analysis.correction.modes"),
    "analyze": "rcdiag.analysis.metrics.compute",
    **dict.fromkeys(("gate_sweep", "simulate_gate"), "rcdiag.analysis.correction.gates"),
    "verl_rejections": "rcdiag.analysis.correction.rejection",
    "trend": "rcdiag.analysis.training.trend",
    "logged_values": "rcdiag.analysis.training.logged",
    "import_run": "rcdiag.importers",
    "Recorder": "rcdiag.record",
    "rescore_run": "rcdiag.score.rescore",
    "RescoreConfig": "rcdiag.score.config",
    **dict.fromkeys(("load_model", "score_sequences"), "rcdiag.score.scoring"),
    **dict.fromkeys(("pad_to_batch", "unpad_from_batch"), "rcdiag.score.packing"),
    **dict.fromkeys(("InputError", "RunDirError", "RcdiagError", "ConfigError"), "rcdiag.errors"),
}

__all__ = sorted(_EXPORTS) + ["__version__"]
__getattr__, _dir = lazy_face(__name__, _EXPORTS)


def __dir__() -> list[str]:
    """The public API only (tab completion in Jupyter), not the subpackages."""
    return __all__
