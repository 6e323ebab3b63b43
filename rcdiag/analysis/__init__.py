"""Pure, mergeable statistics over token rows (no torch), in wings along what they do, bottom first: passes/ (the
pass engine), correction/ (IS modes, rejection, gates), metrics/, distributions/, moe/, training/ (across training),
verdict/. Each wing imports only these ground files (defaults, conventions, thresholds, keys) and the wings before
it. Imports only the store and the ground floor; names load on first use (the kernels compile with numba)."""
from rcdiag.lazy import lazy_face

_EXPORTS = {
    **dict.fromkeys(("DEFAULT_THRESHOLD", "DEFAULT_THRESHOLDS"), "rcdiag.analysis.defaults"),
    **dict.fromkeys(("CONVENTIONS", "DEFAULT_CONVENTION", "get_convention"), "rcdiag.analysis.conventions"),
    **dict.fromkeys(("compute_metrics", "sequence_stats", "METRIC_NAMES", "MetricsAccumulator"),
                    "rcdiag.analysis.metrics.compute"),
    "analyze": "rcdiag.analysis.metrics.compute",
    **dict.fromkeys(("simulate", "sweep", "CorrectionMode", "MODES", "IS_METRIC_NAMES", "get_mode",
                     "ISAccumulator"), "rcdiag.analysis.correction.modes"),
    **dict.fromkeys(("REJECTION_OPTIONS", "rejection_bound", "parse_rejections", "verl_rejections"),
                    "rcdiag.analysis.correction.rejection"),
    **dict.fromkeys(("KEY_STYLES", "rename", "framework_key"), "rcdiag.analysis.keys"),
    "logged_values": "rcdiag.analysis.training.logged",
    **dict.fromkeys(("bootstrap", "SequenceSums"), "rcdiag.analysis.metrics.bootstrap"),
    **dict.fromkeys(("TailAccumulator", "TAIL_NAMES"), "rcdiag.analysis.distributions.tails"),
    **dict.fromkeys(("StrataAccumulator", "SequenceInfo"), "rcdiag.analysis.distributions.strata"),
    "TokenChunk": "rcdiag.analysis.passes.chunks",
    **dict.fromkeys(("stream", "run_pass"), "rcdiag.analysis.passes.engine"),
    **dict.fromkeys(("ChunkConsumer", "BatchConsumer", "Mergeable", "Totals"), "rcdiag.analysis.passes.accum"),
}
__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_face(__name__, _EXPORTS)
