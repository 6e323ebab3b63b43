"""What a probe concludes, as one small record the report, the verdict and the CLI share.

    answer = latest_answer("runs/smollm2")        # None without a probe
    answer.top_line   # "The gap is the engine's bfloat16: an engine in float32 removes 99.9 % of it (mean |ℓ|
                      #  0.0251 → 2.1e-05)."
    answer.factor, answer.setting, answer.removes, answer.evidence

The answer is the single setting whose *residual gap* (`rcdiag.probe.summary.residual`: the gap left if the run
changed that one setting) is smallest. Below STRONG it says "mostly"; below WEAK no single setting explains the
gap; a gap at the float32 noise floor has nothing to attribute.
"""
from __future__ import annotations

import math
import os
from dataclasses import asdict, dataclass, field
from typing import Any

from rcdiag.probe.factors import PREFILL_NOTE
from rcdiag.probe.summary import CHANGES, kernel_floor
from rcdiag.score.routes import PREFILL

STRONG = 0.9
"""A setting that removes at least this share of the gap explains it."""
WEAK = 0.5
"""Below this, no single setting explains the gap."""
FLOOR_GAP = 1e-5
"""An observed mean |ℓ| below this is float32 noise: nothing to attribute."""
CAUSES = {"engine_dtype": "the engine's {run_dtype}", "decode_vs_prefill": "the engine's decode path (KV cache, "
          "other requests in the batch), not its numerics", "batch_invariance": "batch composition in the engine",
          "train_dtype": "the trainer's precision", "attention": "the trainer's attention kernel",
          "packing": "the trainer's packing", "chunk": "the trainer's LM-head chunking",
          "prefix_caching": "the engine's prefix cache", "engine_numerics": "the engine's numerics",
          "router_replay": "routing: the engine and the trainer pick different experts",
          "router_precision": "the trainer's router precision"}


@dataclass(frozen=True)
class ProbeAnswer:
    """A probe's conclusion: the top line, the setting behind it and the evidence lines (plain text)."""

    top_line: str
    factor: str | None
    setting: str | None
    removes: float
    residual_mean_abs: float
    gap_mean_abs: float
    probe: str
    evidence: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _finite(x: Any) -> bool:
    return isinstance(x, int | float) and math.isfinite(x)


def _pct(x: float) -> str:
    return f"{x:.1%}" if x < 0.999 or x >= 1 else f"{x:.2%}"


def probe_answer(summary: dict[str, Any]) -> ProbeAnswer:
    """The conclusion of one probe summary (`rcdiag.probe.summary.summarize`)."""
    gap = float(summary["gap"]["mean_abs"])
    run_dtype = str((summary.get("engine") or {}).get("dtype_resolved") or "dtype")
    rows = [r for r in summary.get("budget") or [] if _finite(r.get("residual_mean_abs"))]
    evidence = _evidence(summary, rows, gap)
    name = str(summary.get("name", "probe"))
    if not math.isfinite(gap) or gap < FLOOR_GAP or not rows:
        line = (f"The gap (mean |ℓ| {gap:.3g}) is at the float32 noise floor: nothing to attribute."
                if math.isfinite(gap) and gap < FLOOR_GAP else "The probe has no setting to attribute the gap to.")
        return ProbeAnswer(line, None, None, math.nan, math.nan, gap, name, evidence)
    best = min(rows, key=lambda r: r["residual_mean_abs"])
    removes, left = 1 - best["residual_mean_abs"] / gap, best["residual_mean_abs"]
    change = best.get("change") or CHANGES.get(best["setting"], best["setting"])
    cause = CAUSES.get(best["factor"], best["factor"]).format(run_dtype=run_dtype)
    moved = f"(mean |ℓ| {gap:.3g} → {left:.2g})"
    if removes >= STRONG:
        line = f"The gap is {cause}: {change} removes {_pct(removes)} of it {moved}."
    elif removes >= WEAK:
        line = f"The gap is mostly {cause}: {change} removes {_pct(removes)} of it {moved}."
    else:
        line = (f"No single setting explains the gap: the best, {change}, removes {_pct(max(removes, 0))} "
                f"{moved}.")
    return ProbeAnswer(line, best["factor"], best["setting"], removes, left, gap, name, evidence)


def _evidence(summary: dict[str, Any], rows: list[dict[str, Any]], gap: float) -> list[str]:
    """One line per other setting worth knowing: what it would leave of the gap, the kernels' noise floor."""
    out = []
    for row in sorted(rows, key=lambda r: r["residual_mean_abs"]):
        change = row.get("change") or row["setting"]
        residual = row["residual_mean_abs"] / gap if gap > 0 else math.nan
        verb = "leaves" if residual <= 1 else "makes it"
        out.append(f"{change}: {verb} {_pct(residual)} of the gap (moves log-probs by mean |Δ| "
                   f"{row['mean_abs']:.2g} from {row['baseline']})")
    if any(r["factor"] == "router_replay" for r in rows) and \
            (summary.get("routing") or {}).get("engine_routes") == PREFILL:
        out.append(PREFILL_NOTE)
    floor = kernel_floor({r["name"]: r for r in summary.get("settings") or [] if r.get("vs_baseline")})
    if floor is not None:
        out.append(f"float32 kernel noise floor on this model: {floor[0]} moves log-probs by up to {floor[1]:.2g}")
    return out


def latest_answer(run_path: str | os.PathLike) -> ProbeAnswer | None:
    """The answer of a run's newest probe, None without one (what the report's verdict and "Where the mismatch
    comes from" quote)."""
    from rcdiag.probe.files import list_probes
    from rcdiag.store.files import MAX_MANIFEST_BYTES
    from rcdiag.store.safefile import read_json

    files = list_probes(run_path)
    if not files:
        return None
    try:  # bounded and never a FIFO (rcdiag.store.safefile): a planted one blocked the report forever
        return probe_answer(read_json(files[-1], "probe summary", MAX_MANIFEST_BYTES))
    except (OSError, ValueError, KeyError):  # InputError is a ValueError
        return None


def answer_lines(summary: dict[str, Any]) -> list[str]:
    """What `rcdiag probe` prints: the top line, the residual-gap table, the exact divergences, the notes."""
    answer = probe_answer(summary)
    gap = summary["gap"]
    lines = [answer.top_line, f"observed gap (rollout vs float32 trainer): mean |ℓ| {gap['mean_abs']:.4g}, "
                              f"k3_kl {gap['k3_kl']:.4g}",
             f"{'if you change':<58} {'residual gap':>12} {'removes':>8}"]
    for row in sorted((r for r in summary.get("budget") or [] if _finite(r.get("residual"))),
                      key=lambda r: r["residual"]):
        lines.append(f"{(row.get('change') or row['setting'])[:58]:<58} {row['residual_mean_abs']:>12.3g} "
                     f"{row['removes']:>8.1%}")
    lines += divergence_lines(summary)
    lines += [f"note: {note}" for note in summary.get("notes", [])]
    return lines


def divergence_rows(summary: dict[str, Any]) -> tuple[list[str], list[list[Any]]]:
    """(headers, one row per engine setting) of the exact divergences of whole distributions."""
    headers = ["engine (prefill) vs reference trainer", "positions", "KL(μ‖π)", "KL(π‖μ)", "TV", "JS",
               "top-1 overlap", "top-5 overlap", "kept mass S", "sampled k1 (kl)", "sampled k3", "k3 − exact KL",
               "rollout k3"]
    rows = []
    for name, rec in (summary.get("divergence") or {}).items():
        if isinstance(rec, dict) and rec.get("positions"):
            rows.append([name, int(rec["positions"]), rec["kl_mu_pi"], rec["kl_pi_mu"], rec["tv"], rec["js"],
                         rec["top1_overlap"], rec["top5_overlap"], rec["kept_mass_mu"], rec.get("kl"),
                         rec.get("k3_kl"), rec.get("k3_minus_exact"), rec.get("rollout_k3_kl")])
    return headers, rows


def divergence_lines(summary: dict[str, Any]) -> list[str]:
    """The exact divergences of whole distributions, one line per engine setting, beside the sampled k3."""
    div = summary.get("divergence") or {}
    out = []
    for name, record in div.items():
        if not isinstance(record, dict) or not record.get("positions"):
            continue
        out.append(f"exact, {name} vs reference trainer at {int(record['positions'])} positions: "
                   f"KL(μ‖π) {record['kl_mu_pi']:.3g}, KL(π‖μ) {record['kl_pi_mu']:.3g}, TV {record['tv']:.3g}, "
                   f"JS {record['js']:.3g}, top-1 overlap {record['top1_overlap']:.1%}, kept mass "
                   f"{record['kept_mass_mu']:.4g}; sampled k3 {record['k3_kl']:.3g} "
                   f"(k3 − exact {record['k3_minus_exact']:+.2g})")
    return out
