"""IS correction modes (TIS / MIS / sequence-level), verl rejection and threshold sweeps, simulated offline.

    simulate(run, "token_truncate", threshold=2.0)            # dict of docs/metrics.md IS metrics
    simulate(run, sequence_mask, convention="swift", return_weights=True)   # + per-token weights DataFrame
    sweep(run)                                                # DataFrame: mode × threshold → IS metrics

Every function reads the data once, streaming record batches (memory O(#sequences in a batch)); a sweep computes
all modes and thresholds in that one pass.
"""
from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from rcdiag.analysis import defaults
from rcdiag.analysis.conventions import DEFAULT_CONVENTION, LOG_RATIO_CLAMP, Convention, get_convention
from rcdiag.analysis.correction import rejection_kernels
from rcdiag.analysis.correction.isstats import IS_METRIC_NAMES, Bounds, ChunkView, ModeStats, update_modes
from rcdiag.analysis.correction.rejection import Rejection, check_verl, keep_rows, parse_rejections
from rcdiag.analysis.correction.verlstats import VerlISExtras, VerlRejectionStats
from rcdiag.analysis.defaults import DEFAULT_THRESHOLD, DEFAULT_THRESHOLDS, IS_MODES
from rcdiag.analysis.passes.accum import ChunkConsumer, Totals
from rcdiag.analysis.passes.chunks import DEFAULT_BATCH_ROWS, TokenChunk
from rcdiag.analysis.passes.engine import stream
from rcdiag.analysis.thresholds import as_number, optional_number, split_band
from rcdiag.errors import ConfigError

LEVELS = ("token", "sequence")
ACTIONS = ("truncate", "mask")


@dataclass(frozen=True)
class CorrectionMode:
    """An IS correction: `level` token|sequence, `action` truncate (clamp the weight to [L, C]) | mask (weight 0
    outside [L, C]); `upper` = C (math.inf: no upper bound, TRL's clip_max=None, convention trl only), `lower` = L
    (None: no lower bound). Bounds are ratio bounds with L ≤ 1 ≤ C."""

    level: str
    action: str
    upper: float = DEFAULT_THRESHOLD
    lower: float | None = None
    lower_rule: str | None = None
    """A preset's default lower bound when none is given: "reciprocal" = 1/C (defaults.IS_MODE_TABLE)."""
    preset: str | None = None
    """A preset's own name when it is not `level_action` (defaults.IS_MODE_TABLE)."""

    def __post_init__(self) -> None:
        if self.level not in LEVELS or self.action not in ACTIONS:
            raise ConfigError(f"unknown correction mode {self.level}_{self.action}; choose one of {', '.join(MODES)}")
        object.__setattr__(self, "upper", as_number(self.upper, "threshold C"))
        object.__setattr__(self, "lower", optional_number(self.lower, "lower bound L"))
        if self.lower is None and self.lower_rule == "reciprocal" and math.isfinite(self.upper):
            object.__setattr__(self, "lower", 1.0 / self.upper)
        if not (isinstance(self.upper, (int, float)) and not math.isnan(self.upper) and self.upper >= 1.0):
            raise ConfigError(f"threshold C must be a number ≥ 1 (or None for no upper bound), got {self.upper!r}")
        if self.lower is not None and not (math.isfinite(self.lower) and 0.0 < self.lower <= 1.0):
            raise ConfigError(f"lower bound L must be in (0, 1], got {self.lower!r}")

    @property
    def name(self) -> str:
        return self.preset or f"{self.level}_{self.action}"

    def with_bounds(self, upper: float | None = None, lower: float | None = None) -> CorrectionMode:
        """A copy with threshold C = `upper` and L = `lower` (None keeps the current value, or follows the new C
        under a preset's lower_rule)."""
        kept = None if self.lower_rule and upper is not None else self.lower
        return replace(self, upper=self.upper if upper is None else as_number(upper, "threshold C"),
                       lower=kept if lower is None else as_number(lower, "lower bound L"))


def presets() -> dict[str, CorrectionMode]:
    """The IS mode presets by name, built from THE table (analysis.defaults.IS_MODE_TABLE, as it is now)."""
    return {name: CorrectionMode(level, action, lower_rule=rule,
                                 preset=None if name == f"{level}_{action}" else name)
            for name, (level, action, rule) in defaults.IS_MODE_TABLE.items()}


MODES: dict[str, CorrectionMode] = presets()
"""The presets by name at import (docs/metrics.md IS modes; get_mode reads the table itself)."""
token_truncate, token_mask, sequence_truncate, sequence_mask = (MODES[n] for n in IS_MODES[:4])


def mode_names() -> tuple[str, ...]:
    """The preset names in table order, as the table is now (the report's sweep, its alternatives): read at each
    call, so a row added to defaults.IS_MODE_TABLE reaches the report as it reaches get_mode."""
    return tuple(defaults.IS_MODE_TABLE)


def get_mode(mode: str | CorrectionMode) -> CorrectionMode:
    if isinstance(mode, CorrectionMode):
        return mode
    known = presets()
    try:
        return known[str(mode)]
    except KeyError:
        raise ConfigError(f"unknown correction mode {mode!r}; choose one of {', '.join(known)}") from None


def lower_for(mode: str | CorrectionMode, convention: str, lower: float | None) -> float | None:
    """The lower bound L a report applies to `mode` under `convention`: L where the framework bounds that action
    from below, else None — verl bounds only its masks (IcePop's "L_C"), so `--lower` there bounds token_mask and
    sequence_mask and leaves the truncations as verl runs them."""
    if lower is None:
        return None
    return lower if get_mode(mode).action in get_convention(convention).allow_lower else None


def _check_convention(mode: CorrectionMode, conv: Convention) -> None:
    if mode.lower is not None and mode.action not in conv.allow_lower:
        raise ConfigError(f"convention {conv.name} has no lower bound for {mode.name}"
                          + ("; use convention canonical or trl" if conv.name != "canonical" else ""))
    if math.isinf(mode.upper):
        if not conv.no_upper:
            raise ConfigError(f"threshold None (no upper bound) is TRL's clip_max=None; convention {conv.name} "
                              "needs a threshold C (or use convention trl)")
        if mode.action == "truncate" and mode.lower is None:  # TRL's GRPOConfig raises ValueError here
            raise ConfigError(f"{mode.name} with neither an upper nor a lower bound: TRL refuses this "
                              "configuration; give a threshold C or a lower bound L")


class ISAccumulator(ChunkConsumer):
    """IS metrics of several (mode, C, L) at once, from one pass: `update_chunk(chunk)`, `merge`, `finish(totals)`.

    Rejection options are applied first (rows they reject are not scored and count as not kept) — except under
    verl, whose IS metrics use the original response mask (rejection ignored; its own `rs_*` numbers report it;
    kept_token_frac / kept_seq_frac still count rejected tokens as not kept).
    Weights and sequence ratios come from the original mask; kept_token_frac / kept_seq_frac are shares of all
    valid tokens / of sequences with T_i > 0. State is O(1) per mode (+ the weights when kept).
    """

    def __init__(self, modes: Sequence[CorrectionMode], convention: str | Convention = DEFAULT_CONVENTION, *,
                 rejection: Iterable[Rejection | str | tuple] = (), keep_weights: bool = False,
                 extras: bool = True, batch_normalize: bool = False) -> None:
        """`extras`: also the numbers only a framework logs (verl's is_seq_*, rs_* …); a sweep, whose table has
        the IS_METRIC_NAMES columns only, leaves them out. `batch_normalize`: finish as with verl's batch
        normalisation (see finish)."""
        self.convention = conv = get_convention(convention)
        self.modes = list(modes)
        self.batch_normalize = batch_normalize
        self._settings = {"rejection": rejection, "keep_weights": keep_weights, "extras": extras,
                          "batch_normalize": batch_normalize}
        for mode in self.modes:
            _check_convention(mode, conv)
        self.rejection = parse_rejections(rejection)
        self.stats = [ModeStats(m.level, m.action, Bounds(m.upper, m.lower), conv, keep_weights)
                      for m in self.modes]
        verl = conv.framework == "verl" and extras
        if conv.framework == "verl":
            check_verl(self.rejection)
        self.extras = [VerlISExtras(m.level, m.action, m.upper, m.lower) for m in self.modes] if verl else []
        self.rs = VerlRejectionStats(self.rejection) if verl and self.rejection else None
        # under verl the IS metrics ignore rejection; kept_token_frac / kept_seq_frac (rcdiag's own) still count
        # what the loss keeps, from a second set of states over the tokens that survive rejection
        self.kept = ([ModeStats(m.level, m.action, Bounds(m.upper, m.lower), conv) for m in self.modes]
                     if conv.is_scope == "original" and self.rejection else [])
        self.keys: list[tuple[np.ndarray, ...]] | None = [] if keep_weights else None

    def update_chunk(self, chunk: TokenChunk) -> None:
        if chunk.n == 0:
            return
        conv = self.convention
        keep = self.rs.update(chunk) if self.rs is not None else keep_rows(self.rejection, chunk)
        view = ChunkView.build(chunk, conv, keep if conv.is_scope == "scored" else None)
        update_modes(self.stats, view)
        if self.kept:
            update_modes(self.kept, ChunkView.build(chunk, conv, keep))
        for extra in self.extras:
            extra.update(chunk, view.lr_rows, view.rho_rows)
        if self.keys is not None:
            self.keys.append((chunk.per_row(chunk.seq_ids), chunk.pos, keep))

    def fresh(self) -> ISAccumulator:
        """An empty accumulator of the same modes, convention and options (stream's per-file copies)."""
        return ISAccumulator(self.modes, self.convention, **self._settings)

    @property
    def single_token_mode(self) -> bool:
        """One token-level mode and nothing but its IS metrics (no verl rejection statistics, extras or weights):
        what ISGroup can update together with others."""
        return (len(self.stats) == 1 and self.stats[0].level == "token" and self.stats[0].weights is None
                and self.rs is None and not self.extras and not self.kept and self.keys is None)

    def merge(self, other: ISAccumulator) -> ISAccumulator:
        if [m for m in other.modes] != self.modes or other.convention != self.convention:
            raise ValueError("cannot merge IS accumulators of different modes or conventions")
        for mine, theirs in zip(self.stats, other.stats, strict=True):
            mine.merge(theirs)
        for mine, theirs in zip(self.extras + self.kept, other.extras + other.kept, strict=True):
            mine.merge(theirs)
        if self.rs is not None:
            self.rs.merge(other.rs)
        if self.keys is not None:
            self.keys += other.keys
        return self

    def finish(self, totals: Totals) -> list[dict[str, float]]:
        """One dict per mode over B = `totals.sequences` rows: IS_METRIC_NAMES (+ under verl the is_seq_*,
        is_oob_ratio, batch_norm_factor and rs_* numbers). Batch normalisation divides the metrics by the token
        mean (canonical), or under verl leaves them as verl logs them (before normalisation) and adds
        batch_norm_factor."""
        num_sequences, batch_normalize = int(totals.sequences), self.batch_normalize
        divide = batch_normalize and self.convention.batch_norm == "divide"
        results = [stats.finish(num_sequences, divide) for stats in self.stats]
        for result, extra in zip(results, self.extras, strict=False):
            result.update(extra.finish(num_sequences, batch_normalize))
        for result, kept in zip(results, self.kept, strict=False):
            after = kept.finish(num_sequences)
            result.update(kept_token_frac=after["kept_token_frac"], kept_seq_frac=after["kept_seq_frac"])
        if self.rs is not None:
            rs = self.rs.finish(num_sequences)
            for result in results:
                result.update(rs)
        return results

    def weights_frame(self, index: int = 0) -> Any:
        """Per-token weights of mode `index`: DataFrame seq_id, pos, weight (NaN on masked rows, 0 where masked
        out or rejected), kept (bool). Batch normalisation divides by the token mean (verl: by verl's factor)."""
        import pandas as pd

        batch_normalize = self.batch_normalize
        stats = self.stats[index]
        parts = stats.weights or []
        weight = np.concatenate(parts) if parts else np.zeros(0)
        keys = self.keys or []
        if self.convention.is_scope == "original" and any(k[2] is not None for k in keys):
            keep = np.concatenate([np.ones(k[0].size, bool) if k[2] is None else k[2] for k in keys])
            weight = np.where(keep | np.isnan(weight), weight, 0.0)  # the loss mask drops rejected tokens
        if batch_normalize:
            weight = weight / (self.extras[index].factor() if self.extras else stats.token_mean())
        seq = np.concatenate([k[0] for k in keys]) if keys else np.zeros(0, dtype=np.int64)
        pos = np.concatenate([k[1] for k in keys]) if keys else np.zeros(0, dtype=np.int64)
        return pd.DataFrame({"seq_id": seq, "pos": pos, "weight": weight, "kept": weight > 0})


class ISGroup(ChunkConsumer):
    """ISAccumulators fed the same chunks whose one token-level mode differs only in the verl rejection options
    that choose the rows it scores — the report's rejection options, each over token_truncate at C — updated by
    ONE kernel call per chunk (rejection_kernels.rejection_views, which also decides the options' keep flags) where each
    made its own numpy flags and pass: the same numbers, bit for bit. A group whose members do anything else
    (verl's rejection statistics, extras, weights, several or different modes) is updated member by member.
    Merging or finishing the group merges or finishes its members."""

    MAX_FUSED = 63
    """Members one kernel call scores (each takes a bit of a row's flags word)."""

    def __init__(self, accumulators: Sequence[ISAccumulator]) -> None:
        self.accumulators = list(accumulators)
        first = self.accumulators[0].stats[0] if self.accumulators else None
        self.fused = 1 < len(self.accumulators) <= self.MAX_FUSED and all(
            a.single_token_mode and a.convention == self.accumulators[0].convention
            and a.stats[0].kernel_params() == first.kernel_params() for a in self.accumulators)
        if self.fused:
            rows = [(r.kernel_row(), j) for j, a in enumerate(self.accumulators) for r in a.rejection]
            self._rejections = [r for a in self.accumulators for r in a.rejection]
            self._options = np.array([row for row, _ in rows], dtype=np.float64).reshape(-1, 4)
            self._option_view = np.array([j for _, j in rows], dtype=np.int64)
            self._uses_rm1 = any(r.statistic_name == "k3" for a in self.accumulators for r in a.rejection)
            self._params = np.array(first.kernel_params(), dtype=np.float64)
            self._swift_ess = first.ess is not None

    def update_chunk(self, chunk: TokenChunk) -> None:
        if not self.fused:
            for accumulator in self.accumulators:
                accumulator.update_chunk(chunk)
            return
        if chunk.n == 0:
            return
        first = self.accumulators[0]
        view = ChunkView.build(chunk, first.convention, None)  # the members' updates read only its valid counts
        lh = chunk.log_ratio(LOG_RATIO_CLAMP)  # the rejection statistics' ℓ̂ and ρ − 1 (rejection.Rejection)
        rm1 = chunk.ratio_m1(LOG_RATIO_CLAMP) if self._uses_rm1 else lh
        views = len(self.accumulators)
        seq_stat = np.zeros((len(self._rejections), chunk.seq_ids.size))
        for r, rejection in enumerate(self._rejections):
            if rejection.scope != "token":
                seq_stat[r] = rejection.sequence_statistic(chunk)
        per_w, per_e, out = rejection_kernels.rejection_views(
            view.lr_rows, view.rho_rows, lh, rm1, chunk.mask, chunk.starts, seq_stat, self._options,
            self._option_view, views, np.zeros(chunk.n, np.uint8 if views <= 8 else np.int64), self._params,
            self._swift_ess)
        no_rows = np.zeros(0)
        for j, accumulator in enumerate(self.accumulators):
            accumulator.stats[0].update(view, (per_w[j], per_e[j], out[j], no_rows))

    def fresh(self) -> ISGroup:
        return ISGroup([a.fresh() for a in self.accumulators])

    def merge(self, other: ISGroup) -> ISGroup:
        for mine, theirs in zip(self.accumulators, other.accumulators, strict=True):
            mine.merge(theirs)
        return self

    def finish(self, totals: Totals) -> list[list[dict[str, float]]]:
        """Each member's finish, in order."""
        return [a.finish(totals) for a in self.accumulators]


class _Default:
    """The `threshold` simulate was not given: C = DEFAULT_THRESHOLD for an IS mode, a gate's own default δ."""

    def __repr__(self) -> str:
        return f"default ({DEFAULT_THRESHOLD:g} for IS modes, each gate's own δ)"


DEFAULT = _Default()


def simulate(data: Any, mode: str | CorrectionMode, threshold: Any = DEFAULT,
             lower: float | None = None, convention: str | None = None, *,
             rejection: Iterable[Rejection | str | tuple] = (), batch_normalize: bool = False,
             return_weights: bool = False, sequences: Any = None, batch_rows: int = DEFAULT_BATCH_ROWS,
             silent: bool = True, keys: str | None = None, **gate_options: Any) -> dict[str, Any]:
    """Simulate one IS correction on `data` (Run, DataFrame or Arrow table of token rows; see compute_metrics).

    `mode`: a preset name (token_truncate, token_mask, sequence_truncate, sequence_mask) or a CorrectionMode —
    or a gate family's name (dppo_tv, token_binary_kl, roll_segment_ratio, skyrl_outlier, nemo_seq_logprob_error …;
    analysis.correction.gate_defs.GATES), simulated by analysis.correction.gates.simulate_gate with `threshold` = δ (default: the
    gate's own) and its options (`advantages=`, `normalize_std=`).
    `threshold` C (default: the run's recorded trainer C — `trainer.correction`, e.g. TRL's 3.0 — else the `keys`
    framework's default, else DEFAULT_THRESHOLD; None: no upper bound — TRL's clip_max=None, convention trl only; a verl "L_U" string is the band
    L, U as verl reads rollout_is_threshold) and `lower` L; booleans and non-numeric strings are refused. `convention`
    picks the framework's formulas (canonical | swift | verl | trl; default canonical, or the framework named by
    `keys`). `rejection`: verl options such as "token_k3:0.01" or ("seq_mean_k1", 2.0, 0.5), chained (see also
    rejection.verl_rejections for verl's own config strings). `batch_normalize` divides the weights by their
    token mean (is_weight_mean becomes 1; ESS is unchanged); under verl the metrics stay as verl logs them
    (before normalisation) and `batch_norm_factor` is verl's divisor.
    `keys`: "canonical" (docs/metrics.md names, default) or "verl" | "swift" | "trl" — the framework's own logged key
    names (keys.py; numbers the framework does not log get an "rcdiag/" prefix).
    Returns {IS metric: float} (NaN where nothing is scored; ESS NaN with a RuntimeWarning when every weight is
    0), plus "weights": DataFrame(seq_id, pos, weight, kept) when `return_weights`.
    """
    from rcdiag.analysis.correction.gates import is_gate, simulate_gate
    from rcdiag.analysis.keys import key_convention, rename

    if is_gate(mode):  # a gate family (analysis.correction.gate_defs): its own simulator, same call shape
        return simulate_gate(data, mode, None if threshold is DEFAULT else threshold, lower, sequences=sequences,
                             batch_rows=batch_rows, silent=silent, keys=keys, convention=convention,
                             **gate_options)
    if gate_options:
        raise ConfigError(f"{', '.join(gate_options)}: options of the gate families only (mode {mode!r} is an IS "
                          "mode)")
    if threshold is DEFAULT:  # a run's own trainer's C where it records one (rcdiag.analysis.correction.trainer_defaults)
        from rcdiag.analysis.correction.trainer_defaults import choose_correction

        name = get_mode(mode).name
        threshold = choose_correction(data, keys, mode=name if name in MODES else None,
                                      convention=convention).threshold
    threshold, lower = split_band(threshold, lower)
    conv = key_convention(keys, convention)
    chosen = get_mode(mode).with_bounds(math.inf if threshold is None else threshold, lower)
    accumulator = ISAccumulator([chosen], conv, rejection=rejection, keep_weights=return_weights,
                                batch_normalize=batch_normalize)
    rows = stream(data, [accumulator], sequences=sequences, batch_rows=batch_rows, silent=silent, desc="simulate")
    result: dict[str, Any] = rename(accumulator.finish(Totals(rows))[0], keys)
    if return_weights:
        result["weights"] = accumulator.weights_frame(0)
    return result


def sweep(data: Any, modes: Iterable[str | CorrectionMode] = tuple(MODES),
          thresholds: Iterable[float] = DEFAULT_THRESHOLDS, convention: str = DEFAULT_CONVENTION, *,
          lower: float | None = None, rejection: Iterable[Rejection | str | tuple] = (),
          batch_normalize: bool = False, sequences: Any = None, batch_rows: int = DEFAULT_BATCH_ROWS,
          silent: bool = True, gate_thresholds: Any = None, advantages: Any = None,
          normalize_std: bool = False) -> Any:
    """IS metrics for every mode × threshold, in one pass over the data.

    Returns a pandas DataFrame with one row per (mode, threshold), columns mode, threshold, then IS_METRIC_NAMES
    (the row order follows `modes`, then `thresholds`). Empty `modes` or `thresholds` → an empty frame with those
    columns. A gate family's name among `modes` (analysis.correction.gate_defs) adds its rows over its own δ grid (or
    `gate_thresholds[name]`) from the same pass: mode = the gate, threshold = δ, the IS_METRIC_NAMES columns in the
    gates' meaning plus the gate columns (analysis.correction.gates.GATE_METRIC_NAMES); `advantages` / `normalize_std` as in
    simulate_gate.
    """
    import pandas as pd

    from rcdiag.analysis.correction.gates import accumulator as gate_accumulator
    from rcdiag.analysis.correction.gates import is_gate, sweep_settings

    modes = list(modes)
    gates = [m for m in modes if is_gate(m)]
    lower = optional_number(lower, "lower bound L")
    grid = [get_mode(m).with_bounds(as_number(c, "threshold C"), lower) for m in modes if not is_gate(m)
            for c in thresholds]
    columns = ["mode", "threshold", *IS_METRIC_NAMES]
    if not grid and not gates:
        return pd.DataFrame(columns=columns)
    consumers: list[Any] = []
    accumulator = (ISAccumulator(grid, convention, rejection=rejection, extras=False,
                                 batch_normalize=batch_normalize) if grid else None)
    consumers += [accumulator] if accumulator is not None else []
    settings = sweep_settings(gates, gate_thresholds) if gates else []
    gate_acc = gate_accumulator(data, settings, sequences=sequences, advantages=advantages,
                                normalize_std=normalize_std) if settings else None
    consumers += [gate_acc] if gate_acc is not None else []
    rows = stream(data, consumers, sequences=sequences, batch_rows=batch_rows, silent=silent, desc="sweep")
    results = accumulator.finish(Totals(rows)) if accumulator is not None else []
    records = [{"mode": m.name, "threshold": m.upper, **r} for m, r in zip(grid, results, strict=True)]
    frame = pd.DataFrame.from_records(records, columns=columns)
    if gate_acc is None:
        return frame
    gate_rows = gate_acc.frame(rows).rename(columns={"gate": "mode"})
    return pd.concat([frame, gate_rows], ignore_index=True) if len(frame) else gate_rows
