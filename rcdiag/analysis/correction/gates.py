"""Gate families simulated offline: which tokens a divergence gate (DPPO binary TV / KL, OpenRLHF tv / binary_kl,
KPop's two-sided KL, prime-rl's |Δp| band, ROLL's filters, SkyRL's masks, NeMo-RL's sequence error mask) keeps,
the share kept per advantage sign, and the survivors' ESS — one streaming, mergeable pass for any number of
settings. The definitions are the table in analysis.correction.gate_defs; the per-framework logged numbers of each gate in
analysis.correction.gate_logs.

    rcdiag.simulate(run, "dppo_tv", 0.2)                  # dict: kept_token_frac, kept_pos_frac, ess, …
    rcdiag.simulate(run, "dppo_tv", 0.2, keys="prime-rl") # + prime-rl's is_masked/mean … under its keys
    rcdiag.gate_sweep(run)                                # DataFrame: gate × δ → the same numbers

Result names (canonical): kept_token_frac / kept_seq_frac (valid tokens / sequences with T > 0 the gate keeps;
a sequence is kept when any of its tokens is), clipped_frac (= 1 − kept_token_frac, the masked share),
fraction_high / fraction_low (valid tokens masked above the upper / below the lower bound; DPPO: A > 0 / A ≤ 0),
masked_seq_frac (sequences with any masked token), kept_pos_frac / kept_neg_frac / kept_zero_frac (kept share
of the valid tokens with A > 0 / A < 0 / A = 0; NaN when there are none or no advantages), adv_pos_frac /
adv_neg_frac (shares of valid tokens with A > 0 / < 0), is_weight_mean / _std / _min / _max (the weight the
framework applies to each valid token: ρ or 1 on kept tokens, 0 on masked ones — Gate.weight), ess (ESS of the
token ratio ρ over the kept tokens, (Σρ)² / (n Σρ²): what the survivors' importance weights still cost),
threshold_low / threshold_high (the bounds applied), advantage_source (analysis.correction.advantages.SOURCES).
"""
from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from rcdiag.analysis.conventions import LOG_RATIO_CLAMP
from rcdiag.analysis.correction import gate_kernels
from rcdiag.analysis.correction.advantages import Advantages, resolve, sequence_rewards
from rcdiag.analysis.correction.gate_defs import GATES, Gate, check_delta, gate_bounds, get_gate, is_gate
from rcdiag.analysis.correction.gate_logs import Decision, extras_for
from rcdiag.analysis.correction.gate_stats import at_level, ell64
from rcdiag.analysis.passes.accum import ChunkConsumer, ExactSums, MomentsArray, Totals, ratio
from rcdiag.analysis.passes.chunks import DEFAULT_BATCH_ROWS, TokenChunk
from rcdiag.analysis.passes.engine import stream
from rcdiag.analysis.thresholds import as_number, optional_number
from rcdiag.errors import ConfigError, InputError

__all__ = ["GATE_METRIC_NAMES", "GateAccumulator", "GateSetting", "gate_sweep", "is_gate", "simulate_gate"]

GATE_METRIC_NAMES = ("kept_token_frac", "kept_seq_frac", "clipped_frac", "fraction_high", "fraction_low",
                     "masked_seq_frac", "kept_pos_frac", "kept_neg_frac", "kept_zero_frac", "adv_pos_frac",
                     "adv_neg_frac", "is_weight_mean", "is_weight_std", "is_weight_min", "is_weight_max", "ess",
                     "threshold_low", "threshold_high")
"""The numbers every gate setting gives (module docstring), in table order."""


@dataclass(frozen=True)
class GateSetting:
    """A gate at δ = `threshold` (and an optional `lower` bound), validated; `lo`, `hi` the applied bounds."""

    gate: Gate
    threshold: float
    lower: float | None
    lo: float
    hi: float

    @classmethod
    def make(cls, gate: str | Gate, threshold: Any = None, lower: Any = None) -> GateSetting:
        g = get_gate(gate)
        delta = g.default if threshold is None else as_number(threshold, f"gate {g.name} δ")
        low = optional_number(lower, f"gate {g.name} lower bound")
        if not math.isfinite(delta) or (low is not None and not math.isfinite(low)):
            raise ConfigError(f"gate {g.name}: δ and the lower bound must be finite numbers")
        check_delta(g, delta, low)
        lo, hi = gate_bounds(g, delta, low)
        return cls(g, delta, low, lo, hi)

    @property
    def name(self) -> str:
        return self.gate.name


def _log(x: float) -> float:
    return math.log(x) if x > 0 else -math.inf


def _compared(setting: GateSetting) -> tuple[float, float]:
    """The setting's (upper, lower) bound as gate_kernels.gate_family compares them: ratios in log space, exactly
    (ρ ≤ C ⇔ ℓ ≤ log C); DPPO's low side as the bound −δ_low of p − q."""
    g = setting.gate
    if g.statistic == "log_ratio" or g.rule == "any_token":
        return _log(setting.hi), _log(setting.lo)
    return setting.hi, -setting.lo if g.rule == "dppo" else setting.lo


def _nested(gate: Gate, his: np.ndarray, los: np.ndarray) -> bool:
    """Whether each setting masks at most what the one before it masks (gate_kernels.gate_family's requirement)."""
    lows = los[1:] >= los[:-1] if gate.rule == "dppo_kl" else los[1:] <= los[:-1]  # −inf ≤ −inf: no lower bound
    return bool(np.all(his[1:] >= his[:-1]) and np.all(lows))


class GateState:
    """One setting of a sweep: a view of row `index` of its family's arrays (GateFamily holds every setting's
    state side by side, so a chunk costs one array add per quantity, not one per setting: issue #32). A state made
    alone is a family of one."""

    def __init__(self, setting: GateSetting) -> None:
        self.setting = setting
        self.family: GateFamily | None = None
        self.index = 0

    def _family(self) -> GateFamily:
        """Its family (for a state made alone, a family of one, made on first use)."""
        return self.family if self.family is not None else GateFamily([self])

    def _alone(self) -> GateFamily:
        """Its family, which must hold it alone: an update or merge through one state of a larger family would
        count that family once per state (update or merge the families: GateAccumulator)."""
        family = self._family()
        if len(family.states) > 1:
            raise ValueError("this GateState is one row of a GateFamily of several settings: update and merge "
                             "the family (GateAccumulator does), not its states one by one")
        return family

    @property
    def counts(self) -> dict[str, int]:
        """gate_kernels.GATE_COUNTS → this setting's count so far."""
        return dict(zip(gate_kernels.GATE_COUNTS, self._family().counts[self.index].tolist(), strict=True))

    def update(self, chunk: TokenChunk, adv: np.ndarray, rewards: np.ndarray, signed: bool = True) -> None:
        """`signed`: some advantage may be known (else every sign count stays 0 without a look at the rows)."""
        self._alone().update(chunk, adv, rewards, signed)

    def merge(self, other: GateState) -> None:
        self._alone().merge(other._alone())

    def finish(self, num_sequences: int, source: str) -> dict[str, Any]:
        return self._family().finish(self.index, num_sequences, source)


class GateFamily:
    """Settings of one gate decided and reduced together: per chunk, the gate's statistic once (memoised on the
    chunk), then ONE compiled pass (gate_kernels.gate_family) for every setting and the framework numbers their extras
    read; the family's state holds every setting side by side (counts [J, 13], the exact sums Σw, Σρ, Σρ² as
    one ExactSums, the moments and extrema of w as arrays, the extras per family), so a chunk's numbers are a few
    array adds whatever J is.

    The kernel needs the settings NESTED: each one masks a subset of what the one before it masks, from above and
    from below (the rules are monotone in their bounds). `families` orders a gate's settings so and starts another
    family where a setting does not nest (a grid of δ always nests; a custom lower bound, e.g. a band [0.9, 3]
    next to [0.5, 2], may not): no setting is ever decided per setting."""

    def __init__(self, states: list[GateState]) -> None:
        self.states = states
        g = self.gate = states[0].setting.gate
        self.rule = gate_kernels.GATE_RULES.index("band" if g.rule == "upper" else g.rule)
        bounds = [_compared(s.setting) for s in states]
        self.his = np.array([hi for hi, _ in bounds], np.float64)
        self.los = np.array([lo for _, lo in bounds], np.float64)
        if any(s.setting.gate != g for s in states) or not _nested(g, self.his, self.los):
            raise ValueError("a GateFamily holds nested settings of one gate (GateFamily.families)")
        J = len(states)
        self.counts = np.zeros((J, len(gate_kernels.GATE_COUNTS)), np.int64)
        # Σw, Σρ, Σρ² of setting j: sums j, J + j, 2J + j (the kernel's block); a ratio weight's Σw is its Σρ
        # exactly (w = ρ on kept rows, 0 on masked ones), so its sums start at Σρ: a third fewer values to add
        self.first = 1 if g.weight == "ratio" else 0
        self.sums = ExactSums((3 - self.first) * J)
        self.moments = MomentsArray(J)
        self.w_lo, self.w_hi = np.full(J, math.inf), np.full(J, -math.inf)
        self.extras = extras_for([s.setting for s in states])
        self.detail = any(e.DETAIL for e in self.extras)
        self.whole = g.level == "sequence" or g.rule == "any_token"
        if g.level == "sequence" and self.rule not in (0, 3):  # the kernel places a whole sequence for these two
            raise ValueError(f"gate {g.name}: a sequence-level gate must be a band, an upper bound or any_token")
        for j, state in enumerate(states):
            state.family, state.index = self, j

    @staticmethod
    def families(states: list[GateState]) -> list[GateFamily]:
        """`states` as families: per gate, the settings ordered by their upper bound, each added to the first
        family it nests in (a new one when none)."""
        by_gate: dict[str, list[GateState]] = {}
        for state in states:
            by_gate.setdefault(state.setting.name, []).append(state)
        out = []
        for group in by_gate.values():
            gate = group[0].setting.gate
            rising = gate.rule == "dppo_kl"  # its low side masks above the bound: a looser one is larger
            chains: list[list[GateState]] = []
            for state in sorted(group, key=lambda s: (_compared(s.setting)[0],
                                                      _compared(s.setting)[1] * (1 if rising else -1))):
                lo = _compared(state.setting)[1]
                for chain in chains:
                    last = _compared(chain[-1].setting)[1]
                    if (lo >= last) if rising else (lo <= last):
                        chain.append(state)
                        break
                else:
                    chains.append([state])
            out += [GateFamily(chain) for chain in chains]
        return out

    def value(self, chunk: TokenChunk) -> np.ndarray:
        """The statistic each setting compares (analysis.correction.gate_defs: rules): per row, or per sequence for a gate at
        the sequence level (gate_stats.at_level)."""
        g = self.gate
        clamp = (lambda v: np.clip(v, -g.clamp, g.clamp)) if g.clamp else (lambda v: v)
        if g.rule == "any_token":
            return chunk.memo(("gate_any", g.clamp), lambda: clamp(ell64(chunk)))
        value = at_level(chunk, g.statistic, g.level, g.reduce)
        if g.statistic == "log_ratio" and g.clamp:
            value = chunk.memo(("gate_value", g.statistic, g.level, g.reduce, g.clamp), lambda: clamp(value))
        return value

    def update(self, chunk: TokenChunk, adv: np.ndarray, rewards: np.ndarray, signed: bool) -> None:
        xs = [v for e in self.extras for v in e.row_values(chunk)]
        flags = [f for e in self.extras if (f := e.row_flag(chunk)) is not None]
        with np.errstate(invalid="ignore"):
            out = gate_kernels.gate_family(
                self.rule, self.value(chunk), ell64(chunk), self.his, self.los, chunk.mask, adv, signed,
                chunk.ratio(LOG_RATIO_CLAMP), self.gate.weight == "ratio", chunk.starts,
                np.stack(xs) if xs else np.empty((0, chunk.n)),
                flags[0] if flags else chunk.memo(("gate", "no_flag"), lambda: np.zeros(chunk.n, np.bool_)),
                self.detail, self.whole)
        d = Decision(*out, whole=self.whole)
        self.counts += d.counts
        self.sums.add(d.sums[self.first:].reshape(len(self.sums), -1))
        self.moments.add(d.counts[:, 0], d.mean, d.m2)
        np.minimum(self.w_lo, d.lo_w, out=self.w_lo)
        np.maximum(self.w_hi, d.hi_w, out=self.w_hi)
        for extra in self.extras:
            extra.update(chunk, d, adv, rewards)

    def merge(self, other: GateFamily) -> GateFamily:
        """Add `other`'s state (a family of the same settings, over other sequences)."""
        self.counts += other.counts
        self.sums.merge(other.sums)
        self.moments.merge(other.moments)
        np.minimum(self.w_lo, other.w_lo, out=self.w_lo)
        np.maximum(self.w_hi, other.w_hi, out=self.w_hi)
        for mine, theirs in zip(self.extras, other.extras, strict=True):
            mine.merge(theirs)
        return self

    def finish(self, j: int, num_sequences: int, source: str) -> dict[str, Any]:
        """Setting j's numbers (module docstring), its framework's after them."""
        c = dict(zip(gate_kernels.GATE_COUNTS, self.counts[j].tolist(), strict=True))
        s, J = self.states[j].setting, len(self.states)
        n = c["valid"]

        def total(q: int) -> float:  # sum q (0 Σw, 1 Σρ, 2 Σρ²) of setting j
            return self.sums.value((max(q, self.first) - self.first) * J + j)

        kept_rho, kept_rho2 = total(1), total(2)
        moments = self.moments.slot(j)
        out: dict[str, Any] = {
            "kept_token_frac": ratio(c["kept"], n), "kept_seq_frac": ratio(c["seqs_kept"], c["seqs"]),
            "clipped_frac": ratio(n - c["kept"], n), "fraction_high": ratio(c["high"], n),
            "fraction_low": ratio(c["low"], n), "masked_seq_frac": ratio(c["seqs_masked"], c["seqs"]),
            **{f"kept_{k}_frac": ratio(c["kept_" + k], c[k]) for k in ("pos", "neg", "zero")},
            "adv_pos_frac": ratio(c["pos"], n) if source != "none" else math.nan,
            "adv_neg_frac": ratio(c["neg"], n) if source != "none" else math.nan,
            "is_weight_mean": ratio(total(0), n),
            "is_weight_std": math.sqrt(max(moments.var, 0.0)) if moments.n > 1 else (0.0 if n else math.nan),
            "is_weight_min": float(self.w_lo[j]) if n else math.nan,
            "is_weight_max": float(self.w_hi[j]) if n else math.nan,
            "ess": kept_rho * kept_rho / (c["kept"] * kept_rho2) if c["kept"] and kept_rho2 > 0 else math.nan,
            "threshold_low": s.lo, "threshold_high": s.hi}
        for extra in self.extras:
            out.update(extra.finish(j, num_sequences, n))
        out["advantage_source"] = source
        return out


class GateAccumulator(ChunkConsumer):
    """Gate settings over one pass: `update_chunk`, `merge`, `fresh`, `finish(B)` → one dict per setting.
    `advantages` (analysis.correction.advantages.Advantages) must be known when any setting's gate is advantage-signed."""

    def __init__(self, settings: Iterable[GateSetting], advantages: Advantages,
                 rewards: Advantages | None = None) -> None:
        self.settings = list(settings)
        self.advantages, self.rewards = advantages, rewards or Advantages("none")
        signed = [s.name for s in self.settings if s.gate.signed]
        if signed and not advantages.known:
            raise ConfigError(f"gate {signed[0]} masks by the sign of the advantage, and none was found: pass "
                              "advantages= (a frame with seq_id and advantage, or 'grpo'), or give the sequences "
                              "a reward and a prompt_id (GRPO advantages are derived from them)")
        self.states = [GateState(s) for s in self.settings]
        self.families = GateFamily.families(self.states)

    def fresh(self) -> GateAccumulator:
        return GateAccumulator(self.settings, self.advantages, self.rewards)

    def update_chunk(self, chunk: TokenChunk) -> None:
        if chunk.n == 0 or not self.states:
            return
        adv = self.advantages.rows(chunk)
        if self.advantages.known and any(s.gate.signed for s in self.settings):
            missing = chunk.mask & np.isnan(adv)
            if missing.any():
                row = int(np.flatnonzero(missing)[0])
                raise InputError(f"no advantage for seq_id {int(chunk.per_row(chunk.seq_ids)[row])} (pos "
                                 f"{int(chunk.pos[row])}): a sign-dependent gate needs one for every valid token",
                                 file=self.advantages.source, field="advantage")
        rewards = self.rewards.rows(chunk)
        for family in self.families:
            family.update(chunk, adv, rewards, self.advantages.known)

    def merge(self, other: GateAccumulator) -> GateAccumulator:
        for mine, theirs in zip(self.families, other.families, strict=True):  # the same settings: the same families
            mine.merge(theirs)
        return self

    def finish(self, totals: Totals) -> list[dict[str, Any]]:
        return [state.finish(int(totals.sequences), self.advantages.source) for state in self.states]

    def frame(self, num_sequences: int) -> Any:
        """The results as a DataFrame: gate, framework, threshold (δ), then GATE_METRIC_NAMES and the rest."""
        import pandas as pd

        records = [{"gate": s.name, "framework": s.gate.framework, "threshold": s.threshold, **r}
                   for s, r in zip(self.settings, self.finish(Totals(num_sequences)), strict=True)]
        return pd.DataFrame.from_records(records, columns=_frame_columns(records))


def _frame_columns(records: list[dict[str, Any]]) -> list[str]:
    head = ["gate", "framework", "threshold", *GATE_METRIC_NAMES, "advantage_source"]
    rest = [k for r in records for k in r if k not in head]
    return head + list(dict.fromkeys(rest))


def accumulator(data: Any, settings: Iterable[GateSetting], *, sequences: Any = None, advantages: Any = None,
                normalize_std: bool = False) -> GateAccumulator:
    """A GateAccumulator for `data` with its advantages (and rewards) resolved (analysis.correction.advantages.resolve)."""
    settings = list(settings)
    adv = resolve(data, sequences, advantages, normalize_std) if settings else Advantages("none")
    rewards = sequence_rewards(data, sequences) if any(s.gate.framework == "nemo-rl" for s in settings) else None
    return GateAccumulator(settings, adv, rewards)


def simulate_gate(data: Any, gate: str | Gate, threshold: Any = None, lower: Any = None, *, sequences: Any = None,
                  advantages: Any = None, normalize_std: bool = False, keys: str | None = None,
                  convention: str | None = None, batch_rows: int = DEFAULT_BATCH_ROWS,
                  silent: bool = True) -> dict[str, Any]:
    """One gate at δ = `threshold` (None: the gate's default, gate_defs.GATES[gate].default) on `data` (Run,
    DataFrame or Arrow table of token rows). `lower`: the low end of a band / DPPO's δ_low. `advantages`: see
    analysis.correction.advantages (None: the data's, else GRPO from reward + prompt_id; `normalize_std` divides by the
    group's std). `keys`: a framework's key style (analysis.keys) — its logged numbers of this gate come back
    under its keys, the rest under rcdiag/. Returns {name: value} (module docstring) + advantage_source."""
    from rcdiag.analysis.keys import check_keys, rename

    style = check_keys(keys)
    if convention not in (None, "canonical") and str(convention).lower() != style:
        raise ConfigError(f"a gate is simulated with its framework's own definition; convention={convention!r} "
                          "does not apply (use keys= for a framework's key names)")
    setting = GateSetting.make(gate, threshold, lower)
    acc = accumulator(data, [setting], sequences=sequences, advantages=advantages, normalize_std=normalize_std)
    rows = stream(data, [acc], sequences=sequences, batch_rows=batch_rows, silent=silent, desc="gate")
    result = acc.finish(Totals(rows))[0]
    source = result.pop("advantage_source")
    return {**rename(result, style), "advantage_source": source}


def sweep_settings(gates: Iterable[str | Gate] | None = None,
                   thresholds: Mapping[str, Iterable[float]] | None = None) -> list[GateSetting]:
    """Every gate's grid of δ (gate_defs: Gate.grid, with its default), or the `thresholds` given per gate."""
    chosen = [get_gate(g) for g in (GATES if gates is None else gates)]
    thresholds = thresholds or {}
    out = []
    for g in chosen:
        grid = thresholds.get(g.name, tuple(sorted({*g.grid, g.default})))
        out += [GateSetting.make(g, d) for d in grid]
    return out


def gate_sweep(data: Any, gates: Iterable[str | Gate] | None = None, thresholds: Mapping[str, Iterable[float]]
               | None = None, *, sequences: Any = None, advantages: Any = None, normalize_std: bool = False,
               batch_rows: int = DEFAULT_BATCH_ROWS, silent: bool = True) -> Any:
    """Every gate (default: all of gate_defs.GATES; signed ones are left out when no advantage is found) × its δ
    grid in ONE pass: a DataFrame, one row per (gate, δ), columns gate, framework, threshold, GATE_METRIC_NAMES,
    advantage_source, then the framework numbers."""
    adv = resolve(data, sequences, advantages, normalize_std)
    settings = [s for s in sweep_settings(gates, thresholds) if adv.known or not s.gate.signed or gates is not None]
    rewards = sequence_rewards(data, sequences) if any(s.gate.framework == "nemo-rl" for s in settings) else None
    acc = GateAccumulator(settings, adv, rewards)
    rows = stream(data, [acc], sequences=sequences, batch_rows=batch_rows, silent=silent, desc="gate sweep")
    return acc.frame(rows)


def report_gates(run: Any, whole: tuple[Advantages, Advantages] | None = None) -> GateAccumulator:
    """The report's gate sweep of `run`: every gate over its δ grid (the signed DPPO gates only when the run has
    advantages, or rewards and prompt ids for GRPO's). `whole`: the (advantages, rewards) of the whole run
    (analysis.correction.advantages.run_advantages) when `run` is one of its shards."""
    adv, rewards = whole if whole is not None else (resolve(run), sequence_rewards(run))
    settings = [s for s in sweep_settings() if adv.known or not s.gate.signed]
    return GateAccumulator(settings, adv, rewards)

