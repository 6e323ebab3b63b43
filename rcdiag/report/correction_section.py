"""The report's correction section, saying each thing once: the sweep as a mode × threshold pivot whose
identical threshold columns are merged ("C = 1.25 … 10"), verl's rejection options that change nothing collapsed
into one line, and the full tables folded in <details>.
"""
from __future__ import annotations

import math
from typing import Any

from rcdiag.report.options import ESS_TARGET
from rcdiag.report.render import Block, fmt

IS_COLUMNS = ("is_weight_mean", "is_weight_std", "is_weight_min", "is_weight_max", "ess", "clipped_frac",
              "fraction_high", "fraction_low", "kept_token_frac", "kept_seq_frac")


def _same(x: dict[str, Any], y: dict[str, Any]) -> bool:
    """Whether two IS metric dicts are identical (NaN equals NaN)."""
    def key(v: Any) -> Any:
        return None if isinstance(v, float) and math.isnan(v) else v
    return all(key(x.get(c)) == key(y.get(c)) for c in IS_COLUMNS)


def threshold_groups(sweep: Any) -> list[list[float]]:
    """Consecutive thresholds of the sweep whose numbers are identical for every mode, grouped."""
    thresholds = sorted(float(c) for c in sweep["threshold"].unique())
    by = {(r["mode"], float(r["threshold"])): r for r in sweep.to_dict(orient="records")}
    modes = list(dict.fromkeys(sweep["mode"]))
    groups: list[list[float]] = []
    for c in thresholds:
        if groups and all(_same(by.get((m, groups[-1][-1]), {}), by.get((m, c), {})) for m in modes):
            groups[-1].append(c)
        else:
            groups.append([c])
    return groups


def _label(group: list[float]) -> str:
    return f"{group[0]:g}" if len(group) == 1 else f"{group[0]:g} … {group[-1]:g}"


def sweep_pivot(sweep: Any) -> tuple[list[str], list[list[Any]], list[str]]:
    """(headers, rows, notes): one row per mode, one column per group of identical thresholds, cells
    'ESS · clipped %'."""
    groups = threshold_groups(sweep)
    by = {(r["mode"], float(r["threshold"])): r for r in sweep.to_dict(orient="records")}
    modes = list(dict.fromkeys(sweep["mode"]))
    headers = ["mode", *(f"C = {_label(g)}" for g in groups)]
    rows = [[m, *(_cell(by.get((m, g[0]))) for g in groups)] for m in modes]
    notes = [f"C = {_label(g)}: identical numbers for every mode." for g in groups if len(g) > 1]
    return headers, rows, notes


def _cell(row: dict[str, Any] | None) -> str:
    if row is None:
        return "—"
    clipped = row["clipped_frac"]
    return f"ESS {fmt(row['ess'])} · {'—' if clipped != clipped else f'{clipped:.2%}'} clipped"


def _is_rows(numbers: dict[str, dict[str, float]]) -> list[list[Any]]:
    return [[name, *(v.get(c) for c in IS_COLUMNS)] for name, v in numbers.items()]


def rejection_blocks(report: Any) -> list[Block]:
    """verl's rejection options (on token_truncate at C): those with numbers identical to plain token_truncate
    reject nothing and are named in one line; the rest get a table."""
    base = report.is_modes.get("token_truncate", {})
    idle = [name for name, v in report.rejection.items() if _same(v, base)]
    active = {name: v for name, v in report.rejection.items() if name not in idle}
    blocks = [Block("h", "verl rejection options (on token_truncate)", level=3)]
    if idle:
        blocks.append(Block("p", f"{', '.join(idle)}: reject nothing at C={report.options.threshold:g} (numbers "
                                 "identical to token_truncate alone)."))
    if active:
        blocks.append(Block("table", headers=["option", *IS_COLUMNS], rows=_is_rows(active)))
    return blocks


def correction_blocks(report: Any) -> list[Block]:
    """The correction section of one run's report."""
    o = report.options
    blocks = [Block("h", "Correction: IS modes and threshold sweep")]
    if report.sweep is not None and len(report.sweep):
        headers, rows, notes = sweep_pivot(report.sweep)
        blocks += [Block("image", "ESS and share clipped against C, every mode on one scale", image="sweep.png"),
                   Block("p", f"Each cell: effective sample size (target ≥ {ESS_TARGET}) · share of tokens "
                              "(token modes) or sequences (sequence modes) clipped or masked. " + " ".join(notes)),
                   Block("table", headers=headers, rows=rows),
                   Block("rawtable", "Full sweep (every IS metric)", headers=["mode", "threshold", *IS_COLUMNS],
                         rows=report.sweep[["mode", "threshold", *IS_COLUMNS]].values.tolist())]
    if report.is_modes:
        blocks.append(Block("rawtable", f"IS modes at C={o.threshold:g} (every metric)", headers=["mode", *IS_COLUMNS],
                            rows=_is_rows(report.is_modes)))
    if report.rejection:
        blocks += rejection_blocks(report)
    return blocks + gate_blocks(report)


GATE_COLUMNS = ("kept_token_frac", "kept_pos_frac", "kept_neg_frac", "kept_seq_frac", "ess", "is_weight_mean")


def gate_blocks(report: Any) -> list[Block]:
    """The gate families' sweep: one row per gate, one cell per δ ('kept % · ESS'), the full table folded."""
    frame = report.gate_sweep
    if frame is None or not len(frame):
        return []
    source = str(frame["advantage_source"].iloc[0])
    said = {"none": "no advantages in this run (no advantage column, no reward + prompt_id): the DPPO gates, "
                    "which mask by the advantage's sign, are left out",
            "grpo": "advantages derived as GRPO's r − mean of the prompt group (verl's rule)",
            "grpo_std": "advantages derived as GRPO's (r − mean) / (std + 1e-6)",
            "sequences": "advantages from the sequences' advantage column",
            "tokens": "advantages from the token rows' advantage column"}.get(source, source)
    rows = []
    for gate, part in frame.groupby("mode" if "mode" in frame.columns else "gate", sort=False):
        cells = [f"δ={t:g}: {_pct(k)} kept · ESS {fmt(e)}" for t, k, e in
                 zip(part["threshold"], part["kept_token_frac"], part["ess"], strict=True)]
        rows.append([gate, part["framework"].iloc[0], " | ".join(cells)])
    return [Block("h", "Gate families: what each framework's mask would keep", level=3),
            Block("p", f"Each gate as its framework defines it (docs/framework-keys.md names file and commit), at its "
                       f"own δ grid: share of valid tokens kept and the ESS of the survivors' ratios. {said}."),
            Block("table", headers=["gate", "framework", "δ: kept · ESS"], rows=rows),
            Block("rawtable", "Gate sweep (every number)", headers=["gate", "threshold", *GATE_COLUMNS],
                  rows=[[r.get("gate", r.get("mode")), r["threshold"], *(r[c] for c in GATE_COLUMNS)]
                        for r in frame.to_dict(orient="records")])]


def _pct(x: float) -> str:
    return "—" if x != x else f"{x:.1%}"
