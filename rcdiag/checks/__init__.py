"""Alignment and convention checks: evidence gathered in the token pass (evidence), one verdict per check
(verdicts). Checks are about the data's integrity; the report's health verdict is about the mismatch."""
from rcdiag.lazy import lazy_face

_EXPORTS = {
    **dict.fromkeys(("Finding", "CheckAccumulator", "SEVERITIES", "accumulate", "sequence_lengths"),
                    "rcdiag.checks.evidence"),
    **dict.fromkeys(("findings", "run_checks", "worst_first"), "rcdiag.checks.verdicts"),
}
__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_face(__name__, _EXPORTS)
