"""The lag part of `rcdiag report`: engine mismatch vs staleness per policy lag, weights that never changed, and
which checkpoint the engine used — for runs that carry versions or a checkpoint attribution.

`lag_section(report)` returns `(blocks, images, data)` like the other sections; a run without versions, without
repeated contexts across versions and without `rcdiag score --checkpoint` adds nothing.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rcdiag.analysis.training.lag import REFERENCES, LagSplit, lag_split
from rcdiag.analysis.training.lag_cause import LagCause, cause_of
from rcdiag.analysis.training.unchanged import MIN_PAIRS, Unchanged, weights_unchanged
from rcdiag.errors import RcdiagError
from rcdiag.report.render import Block, fmt
from rcdiag.store.run import open_run

BUCKET_COLUMNS = ("lag", "tokens", "token_share", "mean_log_ratio", "mean_abs_log_ratio", "k3_kl", "kl",
                  "chi2_token", "ess", "is_weight_mean", "clipped_frac")
EXACT_COLUMNS = ("lag", "tokens", "mean_log_ratio", "engine_mean", "engine_mean_abs", "staleness_mean",
                 "staleness_mean_abs")


def _attribution(run: Any) -> dict[str, Any] | None:
    section = run.info.checkpoints
    file = Path(run.path) / section.attribution if section is not None and section.attribution else None
    if file is None or not file.is_file():
        return None
    try:
        return json.loads(file.read_text())
    except (OSError, json.JSONDecodeError):
        return None


def _split_blocks(split: Any) -> list[Block]:
    floor = split.floor
    blocks = [Block("p", f"{REFERENCES[split.reference]}. Per lag: every metric over that lag's valid tokens, "
                         f"token_truncate at C={split.threshold:g} for the IS columns. The lag-0 floor is the "
                         "engine mismatch alone; a lag-k bucket's excess over it is staleness."
                         + (f" {split.unversioned_tokens:,} tokens carry no version and are left out."
                            if split.unversioned_tokens else "")),
              Block("table", headers=list(BUCKET_COLUMNS),
                    rows=[[fmt(r[c]) for c in BUCKET_COLUMNS] for r in split.buckets.to_dict(orient="records")])]
    if floor is None:
        blocks.append(Block("callout", "No lag-0 tokens: the engine's own floor cannot be told from staleness."))
    else:
        blocks.append(Block("p", f"Floor (lag 0): mean |ℓ| {fmt(floor['mean_abs_log_ratio'])}, k3_kl "
                                 f"{fmt(floor['k3_kl'])}. Staleness: {split.staleness_share:.0%} of the versioned "
                                 "tokens' mean |ℓ| lies above the floor."))
    if split.exact is not None:
        blocks += [Block("h", "Exact split on the checkpoint-rescored tokens", level=3),
                   Block("p", "ℓ = (a_gen − b) + (a − a_gen): the engine part at the weights that sampled (a_gen: "
                              "the trainer's log-prob under the generating checkpoint) plus the policy's change."),
                   Block("table", headers=list(EXACT_COLUMNS),
                         rows=[[fmt(r[c]) for c in EXACT_COLUMNS] for r in split.exact.to_dict(orient="records")])]
    return blocks + [Block("callout", note) for note in split.notes]


def _attribution_blocks(result: dict[str, Any]) -> list[Block]:
    names = result["checkpoints"]
    rows = []
    for label, judged in [*((f"step {s}", j) for s, j in result["by_step"].items()), ("all", result["overall"])]:
        dist = judged["mean_abs_diff"]
        rows.append([label, judged["tokens"], judged["best"] or "indistinguishable", fmt(judged["margin"]),
                     fmt(judged["ratio"]), *[fmt(dist[n]) for n in names]])
    return [Block("h", "Which checkpoint did the engine use?", level=3),
            Block("p", f"`rcdiag score --checkpoint`: {result['sample_per_step']} sequences per step rescored with "
                       f"each checkpoint ({result['train_dtype']}); mean |rollout − checkpoint| per token."),
            Block("table", headers=["step", "tokens", "matches", "margin", "× closer", *names], rows=rows)]


@dataclass(frozen=True)
class LagFindings:
    """The lag split and the weights-unchanged check of a run (computed once, in rcdiag.report.build.judge, for the
    verdict and this section), or the error that stopped them."""

    split: LagSplit | None = None
    unchanged: tuple[Unchanged, ...] = ()
    error: str | None = None

    @property
    def cause(self) -> LagCause | None:
        return None if self.error else cause_of(self.split, list(self.unchanged))


def lag_findings(run: Any, threshold: float) -> LagFindings:
    """LagFindings of `run` (a Run): nothing read beyond the sequences table for a run without versions or repeated
    contexts."""
    try:
        return LagFindings(lag_split(run, threshold=threshold), tuple(weights_unchanged(run)))
    except RcdiagError as exc:
        return LagFindings(error=str(exc))


def lag_section(report: Any) -> tuple[list[Block], dict[str, Any], dict[str, Any]]:
    """(blocks, {}, {"lag": data}) of the report's run (report.lag: LagFindings); three empties when there is
    nothing to say."""
    found = report.lag
    if found.error:
        return [Block("h", "Policy lag"), Block("callout", f"Lag split not computed: {found.error}")], {}, \
            {"lag": {"error": found.error}}
    split, unchanged = found.split, list(found.unchanged)
    run = open_run(report.path)
    attribution = _attribution(run)
    tested = [u for u in unchanged if u.pairs >= MIN_PAIRS]
    if split is None and not any(u.fires for u in unchanged) and attribution is None:
        return [], {}, {}  # nothing lag-related to say (a healthy weights check alone is not worth a section)
    cause = found.cause
    blocks = [Block("h", "Policy lag: engine mismatch vs staleness")]
    if cause is not None:
        blocks.append(Block("callout", f"{cause.severity.upper()}: {cause.cause} — {cause.evidence}. "
                                       f"What to do: {cause.action}."))
    if split is not None:
        blocks += _split_blocks(split)
    blocks += [Block("p", f"Weights unchanged? {u.message()}.") for u in tested]
    if attribution is not None:
        blocks += _attribution_blocks(attribution)
    data = {"split": None if split is None else split.to_dict(),
            "weights_unchanged": [{"side": u.side, "pairs": u.pairs, "identical": u.identical, "fires": u.fires}
                                  for u in unchanged],
            "cause": None if cause is None else cause.to_dict(), "checkpoints": attribution}
    return blocks, {}, {"lag": data}
