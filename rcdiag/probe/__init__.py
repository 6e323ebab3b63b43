"""`rcdiag probe`: where the mismatch comes from — a factor grid of trainer and engine settings, engine replays,
distances and the mismatch budget. Uses score and analysis, never report."""
from rcdiag.lazy import lazy_face

_EXPORTS = {
    **dict.fromkeys(("ProbeConfig", "ProbeResult", "run_probe", "sample_tokens"), "rcdiag.probe.run"),
    **dict.fromkeys(("PROBES_DIR", "list_probes", "write_probe"), "rcdiag.probe.files"),
    **dict.fromkeys(("FACTORS", "DEFAULT_FACTORS"), "rcdiag.probe.factors"),
    **dict.fromkeys(("summarize", "budget_frame", "settings_frame", "DISTANCE_NAMES"), "rcdiag.probe.summary"),
}
__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_face(__name__, _EXPORTS)
