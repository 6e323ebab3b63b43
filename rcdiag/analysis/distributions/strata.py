"""Stratification of ℓ = a − b (docs/metrics.md, 'Strata') as mergeable per-bucket sums.

Each stratum is a row of the STRATA table: a function giving every token a bucket index and the buckets' labels.
Per bucket the accumulator keeps exact sums (tokens, Σℓ, Σ|ℓ|, Σℓ², Σk3, max |ℓ|), so memory is
O(#buckets) plus the O(#sequences) lookup of per-sequence attributes (length, finish reason, reward).
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from rcdiag.analysis.conventions import LOG_RATIO_CLAMP

CLAMP = LOG_RATIO_CLAMP
POW2_EDGES = np.array([0, 1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 2**62])
PROB_EDGES = np.array([0.0, 1e-3, 1e-2, 0.1, 0.3, 0.5, 0.7, 0.9, 0.99, 1.0 + 1e-9])
ENTROPY_EDGES = np.array([0.0, 0.01, 0.1, 0.3, 1.0, 2.0, 4.0, np.inf])
STATS = ("tokens", "sum_l", "sum_abs", "sum_sq", "sum_k3", "max_abs")


@dataclass
class SequenceInfo:
    """Per-sequence attributes, sorted by seq_id (arrays of length #sequences)."""

    seq_id: np.ndarray
    response_len: np.ndarray
    finish: np.ndarray  # int codes into finish_labels
    finish_labels: list[str]
    reward: np.ndarray  # float64, NaN where absent
    prompt_id: np.ndarray  # object

    @classmethod
    def from_table(cls, table: pa.Table) -> SequenceInfo:
        """From a sequences table (seq_id, response_len, finish_reason, reward, prompt_id; nulls allowed)."""
        order = np.argsort(np.asarray(table.column("seq_id"), dtype=np.int64), kind="stable")
        col = {name: table.column(name).to_numpy(zero_copy_only=False)[order] for name in table.column_names}
        finish = np.array(["(none)" if f is None else str(f) for f in col["finish_reason"]], dtype=object)
        labels, codes = np.unique(finish.astype(str), return_inverse=True) if finish.size else (np.array([]), finish)
        reward = np.array([np.nan if r is None else r for r in col["reward"]], dtype=np.float64)
        lengths = np.array([-1 if v is None or v != v else v for v in col["response_len"]], dtype=np.int64)
        return cls(col["seq_id"].astype(np.int64), lengths, np.asarray(codes, dtype=np.int64),
                   [str(x) for x in labels], reward, col["prompt_id"])

    def lookup(self, seq_id: np.ndarray) -> np.ndarray:
        return np.clip(np.searchsorted(self.seq_id, seq_id), 0, max(self.seq_id.size - 1, 0))


@dataclass
class TokenView:
    """What a bucket function sees: one batch's valid finite tokens (arrays [n]) and their sequence rows."""

    pos: np.ndarray
    b: np.ndarray
    entropy: np.ndarray
    token_id: np.ndarray
    last: np.ndarray  # the last token row of its sequence
    seq_row: np.ndarray  # index into SequenceInfo
    info: SequenceInfo


def _pow2_labels(start: int) -> list[str]:
    edges = POW2_EDGES
    out = []
    for lo, hi in zip(edges[start:-1], edges[start + 1:], strict=True):
        out.append(f"{lo}" if hi - lo == 1 else (f"≥ {lo}" if hi > 2**40 else f"{lo}–{hi - 1}"))
    return out


def _edge_labels(edges: np.ndarray, fmt: str) -> list[str]:
    return [f"[{fmt.format(lo)}, {fmt.format(hi)})" if np.isfinite(hi) else f"≥ {fmt.format(lo)}"
            for lo, hi in zip(edges[:-1], edges[1:], strict=True)]


def _digitize(values: np.ndarray, edges: np.ndarray) -> np.ndarray:
    return np.clip(np.searchsorted(edges, values, side="right") - 1, 0, edges.size - 2)


def _by_position(v: TokenView) -> np.ndarray:
    return _digitize(v.pos, POW2_EDGES)


def _by_length(v: TokenView) -> np.ndarray:
    return _digitize(np.maximum(v.info.response_len[v.seq_row], 1), POW2_EDGES) - 1


def _by_prob(v: TokenView) -> np.ndarray:
    return _digitize(np.exp(v.b), PROB_EDGES)


def _by_entropy(v: TokenView) -> np.ndarray:
    unknown = ~np.isfinite(v.entropy)
    return np.where(unknown, ENTROPY_EDGES.size - 1, _digitize(np.nan_to_num(v.entropy), ENTROPY_EDGES))


def _by_token_kind(v: TokenView) -> np.ndarray:
    stopped = v.info.finish_labels.index("stop") if "stop" in v.info.finish_labels else -1
    return np.where(v.last & (v.info.finish[v.seq_row] == stopped), 1, 0)


def _by_finish(v: TokenView) -> np.ndarray:
    return v.info.finish[v.seq_row]


def _by_reward(v: TokenView) -> np.ndarray:
    r = v.info.reward[v.seq_row]
    return np.where(np.isnan(r), 2, np.where(r > 0, 0, 1))


@dataclass(frozen=True)
class Stratum:
    name: str
    title: str
    bucket: Callable[[TokenView], np.ndarray]
    labels: Callable[[SequenceInfo], list[str]]


STRATA: tuple[Stratum, ...] = (
    Stratum("position", "token position", _by_position, lambda _: _pow2_labels(0)),
    Stratum("response_length", "response length (tokens)", _by_length, lambda _: _pow2_labels(1)),
    Stratum("rollout_prob", "rollout probability exp(b)", _by_prob, lambda _: _edge_labels(PROB_EDGES, "{:g}")),
    Stratum("entropy", "training entropy (nats)", _by_entropy,
            lambda _: [*_edge_labels(ENTROPY_EDGES, "{:g}"), "unknown"]),
    Stratum("token_kind", "token kind", _by_token_kind,
            lambda _: ["content", "EOS/stop (last token of a stopped response)"]),
    Stratum("finish_reason", "finish reason", _by_finish, lambda info: list(info.finish_labels) or ["(none)"]),
    Stratum("reward", "reward", _by_reward, lambda _: ["correct (reward > 0)", "wrong (reward ≤ 0)", "no reward"]),
)
"""Every stratification, in report order."""


class StrataAccumulator:
    """Per-bucket sums of ℓ for every stratum in STRATA; `update(view, l)`, `merge`, `finish()` → tables."""

    def __init__(self, info: SequenceInfo) -> None:
        self.info = info
        self.labels = {s.name: s.labels(info) for s in STRATA}
        self.sums = {s.name: np.zeros((len(self.labels[s.name]), len(STATS))) for s in STRATA}

    def update(self, view: TokenView, lr: np.ndarray) -> None:
        """lr: float64 [n] log-ratios a − b of the view's tokens."""
        if not lr.size:
            return
        lc = np.clip(lr, -CLAMP, CLAMP)
        absl = np.abs(lr)
        values = (None, lr, absl, lr * lr, np.expm1(lc) - lc)
        for stratum in STRATA:
            table = self.sums[stratum.name]
            idx = stratum.bucket(view)
            for j, weights in enumerate(values):
                table[:, j] += np.bincount(idx, weights=weights, minlength=table.shape[0])
            np.maximum.at(table[:, 5], idx, absl)

    def merge(self, other: StrataAccumulator) -> StrataAccumulator:
        for name, table in self.sums.items():
            table[:, :5] += other.sums[name][:, :5]
            table[:, 5] = np.maximum(table[:, 5], other.sums[name][:, 5])
        return self

    def finish(self) -> dict[str, list[dict[str, Any]]]:
        """{stratum: [{bucket, tokens, share, kl, mean_log_ratio, mean_abs, rms, max_abs, k3_kl}]}; empty buckets
        are left out. kl = E[b − a] and k3_kl as docs/metrics.md, within the bucket."""
        out: dict[str, list[dict[str, Any]]] = {}
        for stratum in STRATA:
            table = self.sums[stratum.name]
            total = table[:, 0].sum()
            rows = []
            for label, (n, sl, sabs, ssq, sk3, mx) in zip(self.labels[stratum.name], table, strict=True):
                if n:
                    rows.append({"bucket": label, "tokens": int(n), "share": n / total, "kl": -sl / n,
                                 "mean_log_ratio": sl / n, "mean_abs": sabs / n, "rms": float(np.sqrt(ssq / n)),
                                 "max_abs": mx, "k3_kl": sk3 / n})
            out[stratum.name] = rows
        return out


def titles() -> dict[str, str]:
    return {s.name: s.title for s in STRATA}
