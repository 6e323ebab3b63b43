"""verl's rejection options (token_k1 … seq_max_k3): per-row keep masks from log-ratio statistics k1/k2/k3."""
from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from rcdiag.analysis.conventions import LOG_RATIO_CLAMP
from rcdiag.analysis.correction import rejection_kernels
from rcdiag.analysis.passes.chunks import TokenChunk
from rcdiag.analysis.thresholds import as_number, optional_number
from rcdiag.errors import ConfigError

STATISTICS = rejection_kernels.REJECTION_STATISTICS
SCOPES = rejection_kernels.REJECTION_SCOPES
OPTIONS = tuple(f"{scope}_{stat}" for scope in SCOPES for stat in STATISTICS if (scope, stat) != ("seq_max", "k1"))
"""token_k1, token_k2, token_k3, seq_sum_k1..3, seq_mean_k1..3, seq_max_k2, seq_max_k3 (docs/metrics.md)."""


def _k1(lh: np.ndarray, rho_m1: np.ndarray) -> np.ndarray:
    return -lh


def _k2(lh: np.ndarray, rho_m1: np.ndarray) -> np.ndarray:
    return 0.5 * lh * lh


def _k3(lh: np.ndarray, rho_m1: np.ndarray) -> np.ndarray:
    return rho_m1 - lh


_STAT = {"k1": _k1, "k2": _k2, "k3": _k3}


@dataclass(frozen=True)
class Rejection:
    """One rejection option: keep a token (token_*) or a whole sequence (seq_*) when its statistic is in bounds.

    k1 = −ℓ̂ = log(π_rollout/π_train): bounds are ratio bounds, kept when log(lower) ≤ k1 ≤ log(upper), lower
    defaulting to 1/upper. k2 = ½ℓ̂², k3 = exp(ℓ̂) − 1 − ℓ̂: kept when k ≤ upper (and ≥ lower when given).
    seq_sum / seq_mean / seq_max reduce the token statistic over the valid tokens of a sequence (mean of an
    all-masked sequence is 0; max is 0).
    """

    option: str
    upper: float
    lower: float | None = None

    def __post_init__(self) -> None:
        if self.option not in OPTIONS:
            raise ConfigError(f"unknown rejection option {self.option!r}; choose from {', '.join(OPTIONS)}")
        object.__setattr__(self, "upper", as_number(self.upper, f"rejection {self.option} upper bound"))
        object.__setattr__(self, "lower", optional_number(self.lower, f"rejection {self.option} lower bound"))
        if not (math.isfinite(self.upper) and self.upper > 0):
            raise ConfigError(f"rejection {self.option}: upper bound must be a positive number, got {self.upper}")
        if self.lower is not None and not (0 < self.lower <= self.upper if self.statistic_name == "k1"
                                           else self.lower <= self.upper):
            raise ConfigError(f"rejection {self.option}: lower bound {self.lower} must be ≤ upper {self.upper}"
                              + (" and > 0" if self.statistic_name == "k1" else ""))

    @property
    def statistic_name(self) -> str:
        """k1, k2 or k3."""
        return self.option.rsplit("_", 1)[1]

    @property
    def scope(self) -> str:
        return self.option.rsplit("_", 1)[0]

    def bounds(self) -> tuple[float, float]:
        """(lo, hi) on the statistic itself."""
        if self.statistic_name == "k1":
            lower = self.lower if self.lower is not None else 1.0 / self.upper
            return math.log(lower), math.log(self.upper)
        return (-math.inf if self.lower is None else self.lower), self.upper

    def kernel_row(self) -> tuple[float, float, float, float]:
        """This option as a row of rejection_kernels.rejection_views' `options`: statistic and scope codes, lo, hi."""
        lo, hi = self.bounds()
        return float(STATISTICS.index(self.statistic_name)), float(SCOPES.index(self.scope)), lo, hi

    def statistic(self, chunk: TokenChunk) -> tuple[np.ndarray, np.ndarray | None]:
        """(token statistic per row [n], per-sequence statistic [S] or None for token options). Masked rows hold
        the statistic of ℓ̂ = 0 (irrelevant); a sequence without valid rows has seq_sum = seq_mean = seq_max = 0."""
        name = self.statistic_name  # the statistic's rows are computed once per chunk for all options using it
        values = chunk.memo(("rejection", name), lambda: _STAT[name](chunk.log_ratio(LOG_RATIO_CLAMP),
                                                                    chunk.ratio_m1(LOG_RATIO_CLAMP)))
        return values, (None if self.scope == "token" else self.sequence_statistic(chunk))

    def sequence_statistic(self, chunk: TokenChunk) -> np.ndarray:
        """A seq_* option's statistic per sequence [S], from the chunk's per-sequence table (kernels.SEQ_COLUMNS:
        its compensated Σℓ̂, Σk3 and max k3, the same numbers the metrics sum) — what both the numpy form here and
        rejection_kernels.rejection_views compare with the bounds. seq_mean divides by max(T_i, 1)."""
        name, scope = self.statistic_name, self.scope
        if scope == "seq_max":
            if name == "k3":
                return chunk.column("max_k3")
            top = np.minimum(chunk.column("max_abs"), LOG_RATIO_CLAMP)  # max |ℓ̂|: ½x² grows with |x|
            return 0.5 * top * top
        if name == "k2":
            lh = chunk.memo(("rejection_valid", name), lambda: chunk.valid_or(
                _k2(chunk.log_ratio(LOG_RATIO_CLAMP), None), 0.0))
            total = chunk.seq_sum(lh)
        else:
            total = -chunk.column("sum_lhat") if name == "k1" else chunk.column("sum_k3")
        return total / np.maximum(chunk.counts, 1) if scope == "seq_mean" else total

    def keep_rows(self, chunk: TokenChunk) -> np.ndarray:
        """bool [n]: rows this option keeps (masked rows are irrelevant and kept)."""
        return self.keep_from(chunk, *self.statistic(chunk))

    def keep_from(self, chunk: TokenChunk, values: np.ndarray, per_seq: np.ndarray | None) -> np.ndarray:
        """keep_rows from an already computed `statistic(chunk)`."""
        lo, hi = self.bounds()
        if per_seq is None:
            return (values >= lo) & (values <= hi)
        return chunk.per_row((per_seq >= lo) & (per_seq <= hi))


def parse_rejection(item: Rejection | str | tuple) -> Rejection:
    """Rejection from a Rejection, ("token_k3", 0.01[, lower]) or "token_k3:0.01" / "token_k1:0.5_2.0" (verl's
    "lower_upper" threshold string)."""
    if isinstance(item, Rejection):
        return item
    if isinstance(item, tuple):
        return Rejection(*item)
    if isinstance(item, str) and ":" in item:
        option, _, text = item.partition(":")
        try:
            values = [float(x) for x in text.split("_", 1)]
        except ValueError:
            values = []
        if len(values) == 2:
            return Rejection(option.strip(), values[1], values[0])
        if len(values) == 1:
            return Rejection(option.strip(), values[0])
    raise ConfigError(f"cannot read rejection option {item!r}: use e.g. 'token_k3:0.01', 'token_k1:0.5_2.0' or "
                      "('seq_mean_k2', 0.005)")


def parse_rejections(items: Iterable[Rejection | str | tuple] | str | None) -> tuple[Rejection, ...]:
    if items is None:
        return ()
    if isinstance(items, (str, Rejection)):
        items = (items,)
    return tuple(parse_rejection(item) for item in items)


def check_verl(rejections: tuple[Rejection, ...]) -> None:
    """ConfigError for what verl 0.9.0 refuses (`_parse_rollout_rs_thresholds`, rollout_corr_helper.py): a lower
    bound on a k2/k3 option (verl takes a single upper bound there)."""
    for rejection in rejections:
        if rejection.lower is not None and rejection.statistic_name != "k1":
            raise ConfigError(f"rejection {rejection.option}: verl takes a single upper bound for k2/k3 options "
                              f"(a 'lower_upper' threshold raises ValueError there); drop the lower bound "
                              f"{rejection.lower} or use convention canonical")


def verl_rejections(rollout_rs: str, rollout_rs_threshold: str | float) -> tuple[Rejection, ...]:
    """Rejections from verl's own config values: `rollout_rs="token_k1,seq_mean_k3"` (comma list, duplicates
    dropped, order kept) and `rollout_rs_threshold` (one value shared by all options, or one per option; k1 options
    take "lower_upper" or an upper bound whose lower bound is 1/upper), as verl 0.9.0 reads them."""
    options = list(dict.fromkeys(o.strip() for o in str(rollout_rs).split(",") if o.strip()))
    specs = [p.strip() for p in str(rollout_rs_threshold).split(",") if p.strip()]
    if not options or len(specs) not in (1, len(options)):
        raise ConfigError(f"rollout_rs_threshold {rollout_rs_threshold!r}: give one value shared by all options or "
                          f"exactly {len(options)} (one per option of {rollout_rs!r})")
    specs = specs * len(options) if len(specs) == 1 else specs
    out = tuple(parse_rejection(f"{option}:{spec}") for option, spec in zip(options, specs, strict=True))
    check_verl(out)
    return out


def keep_rows(rejections: tuple[Rejection, ...], chunk: TokenChunk) -> np.ndarray | None:
    """bool [n] rows kept by every option (chained: all must pass), or None when there are no options."""
    keep = None
    for rejection in rejections:
        rows = rejection.keep_rows(chunk)
        keep = rows if keep is None else keep & rows
    return keep


REJECTION_OPTIONS = ("token_k1", "token_k3", "seq_mean_k1", "seq_mean_k3", "seq_max_k3")
"""verl's rejection options the report simulates at --threshold (on top of token_truncate), docs/metrics.md."""


def rejection_bound(option: str, threshold: float) -> tuple[str, float]:
    """verl rejection option at --threshold C: k1 options bound the ratio to [1/C, C]; k2/k3 options bound the
    statistic by its value at ρ = C (k2 = ½ log²C, k3 = C − 1 − log C), so every option rejects "beyond C"."""
    log_c = float(np.log(threshold))
    bound = {"k1": threshold, "k2": 0.5 * log_c**2, "k3": threshold - 1 - log_c}[option.rsplit("_", 1)[1]]
    return option, bound
