"""Pure, mergeable statistics over token rows (no torch): metrics, IS modes, rejection, bootstrap, tails, strata.
Imports only the store and the ground floor; names load on first use (the kernels compile with numba)."""
from rcdiag.lazy import lazy_face

_EXPORTS = {
    **dict.fromkeys(("DEFAULT_THRESHOLD", "DEFAULT_THRESHOLDS"), "rcdiag.analysis.defaults"),
    **dict.fromkeys(("CONVENTIONS", "DEFAULT_CONVENTION", "get_convention"), "rcdiag.analysis.conventions"),
    **dict.fromkeys(("compute_metrics", "sequence_stats", "METRIC_NAMES", "MetricsAccumulator"),
                    "rcdiag.analysis.metrics"),
    **dict.fromkeys(("simulate", "sweep", "analyze", "CorrectionMode", "MODES", "IS_METRIC_NAMES", "get_mode",
                     "ISAccumulator"), "rcdiag.analysis.correction"),
    **dict.fromkeys(("REJECTION_OPTIONS", "rejection_bound", "parse_rejections", "verl_rejections"),
                    "rcdiag.analysis.rejection"),
    **dict.fromkeys(("KEY_STYLES", "rename", "framework_key"), "rcdiag.analysis.keys"),
    "logged_values": "rcdiag.analysis.logged",
    **dict.fromkeys(("bootstrap", "SequenceSums"), "rcdiag.analysis.bootstrap"),
    **dict.fromkeys(("TailAccumulator", "TAIL_NAMES"), "rcdiag.analysis.tails"),
    **dict.fromkeys(("StrataAccumulator", "SequenceInfo"), "rcdiag.analysis.strata"),
    "TokenChunk": "rcdiag.analysis.chunks",
    **dict.fromkeys(("stream", "run_pass"), "rcdiag.analysis.engine"),
    **dict.fromkeys(("ChunkConsumer", "BatchConsumer", "Mergeable", "Totals"), "rcdiag.analysis.accum"),
}
__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_face(__name__, _EXPORTS)
