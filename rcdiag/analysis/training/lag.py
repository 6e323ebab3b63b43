"""Async RL: split the log-ratio into engine mismatch and staleness, by the policy lag of each token.

An asynchronous trainer (verl fully-async, AReaL, prime-rl, TRL AsyncGRPO, slime) trains on samples its engine drew
one or more policy versions ago, so ℓ = a − b is engine mismatch plus the policy's change since. With the
store's versions (rcdiag.store.schema: the sequence's / token's `policy_version`, the sequence's
`trainer_version`) every token has a lag = trainer version − generating version:

- `lag_split`: the tokens bucketed by lag, every metric per bucket (compute_metrics, token_truncate's IS
  metrics at C, ESS, mean ℓ and |ℓ|). The lag-0 bucket is the floor — engine mismatch alone, the trainer on the
  weights that sampled — and a lag-k bucket's excess over it is staleness. `staleness_share` = the share of the
  versioned tokens' mean |ℓ| above the floor (martingale's staleness share).
- With the trainer-side log-probs under each generating version (`rcdiag score --rescore-only RUN --checkpoint
  V=PATH,…`, read through the manifest's `checkpoints` section), the split is exact per token (`exact_split`):
  ℓ = (a_gen − b) + (a − a_gen), the engine part at the same weights plus the staleness part, bit for bit.

Where the trainer's version is not recorded (slime, AReaL) the lag is measured from the newest version among
the step's samples (taken as on-policy); the result says which reference it used.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow.parquet as pq

from rcdiag.analysis.correction.modes import simulate
from rcdiag.analysis.defaults import DEFAULT_THRESHOLD
from rcdiag.analysis.metrics.compute import compute_metrics

REFERENCES = {
    "trainer_version": "lag = trainer_version − policy_version (both recorded)",
    "step_newest": "lag = the newest policy version among the step's samples − the sample's (the trainer's own "
                   "version is not recorded; the freshest samples are taken as on-policy)",
}
IS_COLUMNS = ("is_weight_mean", "ess", "clipped_frac")
TOKEN_COLUMNS = ("seq_id", "pos", "rollout_logprob", "train_logprob", "mask", "policy_version")


@dataclass
class LagSplit:
    """The lag split of a run (module docstring). `buckets`: one row per lag (tokens, sequences, token_share,
    mean_log_ratio, mean_abs_log_ratio, compute_metrics' names, IS_COLUMNS); `floor`: the lag-0 row (None without
    lag-0 tokens); `staleness`: per lag ≥ 1, the excess of mean |ℓ|, mean ℓ and k3_kl over the floor;
    `exact`: per lag, the means of the exact engine and staleness parts on the checkpoint-rescored tokens (None
    without them)."""

    reference: str
    buckets: pd.DataFrame
    floor: dict[str, Any] | None
    staleness: pd.DataFrame
    staleness_share: float
    unversioned_tokens: int
    threshold: float
    exact: pd.DataFrame | None = None
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """The JSON form (metrics.json's `lag`)."""
        return {"reference": self.reference, "reference_text": REFERENCES[self.reference],
                "threshold": self.threshold, "buckets": self.buckets.to_dict(orient="records"),
                "floor": self.floor, "staleness": self.staleness.to_dict(orient="records"),
                "staleness_share": self.staleness_share, "unversioned_tokens": self.unversioned_tokens,
                "exact": None if self.exact is None else self.exact.to_dict(orient="records"), "notes": self.notes}


def exact_split(train: np.ndarray, rollout: np.ndarray, generating: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(engine part a_gen − b, staleness part a − a_gen) per token, in float64 from the stored float32 values:
    both differences of float32 numbers are exact in float64, so their sum is a − b exactly (bit for bit)."""
    a, b, g = (np.asarray(x, dtype=np.float64) for x in (train, rollout, generating))
    return g - b, a - g


def token_lags(run: Any) -> tuple[pd.DataFrame, str]:
    """The run's token rows (TOKEN_COLUMNS, plus step, generating version and lag; lag NaN where unversioned)
    and the reference used. Reads the versions' columns only when the run has them (None otherwise: returns an
    empty frame)."""
    seqs = run.sequence_table(["seq_id", "step", "policy_version", "trainer_version"]).to_pandas()
    per_token = any("policy_version" in pq.read_schema(f).names for f in run.token_files)
    if not per_token and seqs["policy_version"].isna().all():
        return pd.DataFrame(columns=[*TOKEN_COLUMNS, "version", "step", "lag", "trainer_version"]), "trainer_version"
    tokens = run.token_table(list(TOKEN_COLUMNS)).to_pandas()
    per_seq = seqs.set_index("seq_id")
    version = tokens["policy_version"].astype("Float64")
    version = version.fillna(tokens["seq_id"].map(per_seq["policy_version"]).astype("Float64"))
    tokens["version"] = version.astype(float)
    tokens["step"] = tokens["seq_id"].map(per_seq["step"]).astype(float)
    trainer = tokens["seq_id"].map(per_seq["trainer_version"]).astype(float)
    if trainer.notna().any():
        reference = "trainer_version"
    else:
        reference = "step_newest"
        key = tokens["step"].fillna(-1.0)
        trainer = tokens["version"].groupby(key).transform("max")
    tokens["lag"] = trainer - tokens["version"]
    tokens["trainer_version"] = trainer
    return tokens, reference


def _bucket(frame: pd.DataFrame, lag: int, total: int, threshold: float) -> dict[str, Any]:
    valid = frame[frame["mask"].fillna(True).astype(bool)]
    ell = valid["train_logprob"].to_numpy(np.float64) - valid["rollout_logprob"].to_numpy(np.float64)
    rows = frame[["seq_id", "pos", "rollout_logprob", "train_logprob", "mask"]]
    metrics = compute_metrics(rows)
    weights = simulate(rows, "token_truncate", threshold)
    return {"lag": lag, "tokens": int(ell.size), "sequences": int(frame["seq_id"].nunique()),
            "token_share": ell.size / total if total else float("nan"),
            "mean_log_ratio": float(ell.mean()) if ell.size else float("nan"),
            "mean_abs_log_ratio": float(np.abs(ell).mean()) if ell.size else float("nan"),
            **{k: v for k, v in metrics.items() if k not in ("tokens", "sequences", "empty_sequences")},
            **{k: weights[k] for k in IS_COLUMNS}}


def _staleness(buckets: pd.DataFrame, floor: dict[str, Any] | None) -> pd.DataFrame:
    if floor is None:
        return pd.DataFrame(columns=["lag", "tokens", "excess_mean_abs", "excess_mean", "excess_k3_kl", "times"])
    stale = buckets[buckets["lag"] > 0]
    return pd.DataFrame({
        "lag": stale["lag"], "tokens": stale["tokens"],
        "excess_mean_abs": stale["mean_abs_log_ratio"] - floor["mean_abs_log_ratio"],
        "excess_mean": stale["mean_log_ratio"] - floor["mean_log_ratio"],
        "excess_k3_kl": stale["k3_kl"] - floor["k3_kl"],
        "times": stale["mean_abs_log_ratio"] / floor["mean_abs_log_ratio"]}).reset_index(drop=True)


def lag_split(run: Any, *, threshold: float = DEFAULT_THRESHOLD) -> LagSplit | None:
    """The lag split of `run` (a Run), or None when it carries no policy versions (module docstring). Metrics of
    a bucket are canonical, over that bucket's valid tokens. Raises InputError where compute_metrics would."""
    tokens, reference = token_lags(run)
    versioned = tokens[tokens["lag"].notna()]
    if versioned.empty:
        return None
    lags = versioned["lag"].round().astype(np.int64)
    total = int(versioned["mask"].fillna(True).astype(bool).sum())
    rows = [_bucket(frame, int(lag), total, threshold) for lag, frame in versioned.groupby(lags, sort=True)]
    buckets = pd.DataFrame(rows)
    floor_rows = buckets[buckets["lag"] == 0]
    floor = None if floor_rows.empty else floor_rows.iloc[0].to_dict()
    overall = float(np.average(buckets["mean_abs_log_ratio"], weights=buckets["tokens"])) if total else np.nan
    share = float("nan") if floor is None or not overall else max(0.0, 1 - floor["mean_abs_log_ratio"] / overall)
    notes = []
    if (buckets["lag"] < 0).any():
        notes.append("some tokens have a negative lag (generated by weights newer than the trainer's): the "
                     "versions are not counted from one origin")
    result = LagSplit(reference=reference, buckets=buckets, floor=floor, staleness=_staleness(buckets, floor),
                      staleness_share=share, unversioned_tokens=int(len(tokens) - len(versioned)),
                      threshold=threshold, notes=notes)
    result.exact = _exact_by_lag(run, versioned)
    return result


def _exact_by_lag(run: Any, tokens: pd.DataFrame) -> pd.DataFrame | None:
    """Per lag: mean ℓ, mean engine part, mean staleness part on the tokens whose generating version has a
    checkpoint column (RUN/checkpoints/logprobs.parquet, labelled by version in the manifest)."""
    section = run.info.checkpoints  # what `rcdiag score --checkpoint` wrote (store.manifest.Checkpoints)
    if section is None:
        return None
    by_version = {int(v): name for name, v in section.versions.items() if isinstance(v, int)}
    file = Path(run.path) / (section.logprobs or "")
    if not by_version or not file.is_file():
        return None
    scored = pq.read_table(file).to_pandas()
    joined = tokens.merge(scored[["seq_id", "pos", *[f"logprob:{n}" for n in by_version.values()]]],
                          on=["seq_id", "pos"])
    generating = np.full(len(joined), np.nan)
    for version, name in by_version.items():
        here = joined["version"].to_numpy() == version
        generating[here] = joined.loc[here, f"logprob:{name}"].to_numpy(np.float64)
    keep = np.isfinite(generating) & joined["mask"].fillna(True).astype(bool).to_numpy()
    if not keep.any():
        return None
    joined = joined[keep]
    engine, stale = exact_split(joined["train_logprob"], joined["rollout_logprob"], generating[keep])
    frame = pd.DataFrame({"lag": joined["lag"].round().astype(np.int64).to_numpy(), "engine": engine,
                          "staleness": stale, "ell": engine + stale})
    out = frame.groupby("lag").agg(tokens=("ell", "size"), mean_log_ratio=("ell", "mean"),
                                   engine_mean=("engine", "mean"), engine_mean_abs=("engine", lambda x: x.abs().mean()),
                                   staleness_mean=("staleness", "mean"),
                                   staleness_mean_abs=("staleness", lambda x: x.abs().mean()))
    return out.reset_index()
