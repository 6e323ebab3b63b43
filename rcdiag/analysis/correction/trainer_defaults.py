"""Which IS setting a report, an export or a simulation uses when the user names none: the run's own trainer's
(`trainer.correction`, recorded by the TRL / verl hooks or given to `rcdiag import --trainer-setting`), else the
defaults of the framework whose keys are asked for (`--keys trl` → TRL's sequence_mask at C=3), else rcdiag's.
An explicit mode / threshold / lower bound always wins. `choose_correction` says which it used and why, so every
surface can print it — the curves of an export then land in the trainer's panels with the trainer's numbers.

Light (no kernels, no pandas): the CLI, the report options and the exporter read it.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from rcdiag.analysis.conventions import get_convention
from rcdiag.analysis.defaults import DEFAULT_THRESHOLD, IS_MODE_TABLE, IS_MODES
from rcdiag.analysis.keys import check_keys, key_convention
from rcdiag.errors import ConfigError, did_you_mean
from rcdiag.store.context import FRAMEWORKS, correction_section
from rcdiag.store.manifest import Manifest

RCDIAG_MODE = IS_MODES[0]
"""rcdiag's own IS mode when nothing else says: token_truncate (the usual TIS; IS_MODE_TABLE's first row)."""
KEY_FRAMEWORK = {"trl": "trl", "verl": "verl", "swift": "swift"}
"""--keys style → the framework whose correction defaults its IS keys follow (rcdiag.store.context.FRAMEWORKS)."""


@dataclass(frozen=True)
class TrainerSetting:
    """The IS setting chosen for a run: mode, threshold C (None: no upper bound, TRL's clip_max=None), lower bound
    L, verl rejection options, and why — `origin` given | recorded | framework | rcdiag, `why` in words."""

    mode: str
    threshold: float | None
    lower: float | None = None
    rejection: tuple[str, ...] = ()
    origin: str = "rcdiag"
    why: str = "rcdiag's default"
    notes: tuple[str, ...] = field(default_factory=tuple)
    """What was dropped or assumed on the way (a lower bound the convention has no place for, …)."""

    def label(self) -> str:
        """'sequence_mask at C=3' (', L=0.5', ', no upper bound')."""
        bound = "no upper bound" if self.threshold is None else f"C={self.threshold:g}"
        low = "" if self.lower is None else f", L={self.lower:g}"
        return f"{self.mode} at {bound}{low}" + (f" after {', '.join(self.rejection)}" if self.rejection else "")

    def sentence(self) -> str:
        """'IS setting: sequence_mask at C=3 — the run's recorded TRL settings (…).' with the notes after."""
        return f"IS setting: {self.label()} — {self.why}." + "".join(f" {n}" for n in self.notes)


def _quote(settings: dict[str, Any]) -> str:
    """The settings that say something (None ones left out) as name=value."""
    return ", ".join(f"{k}={v!r}" for k, v in settings.items() if v is not None)


def framework_setting(framework: str) -> TrainerSetting:
    """The framework's own defaults as an IS setting: its mode where its defaults turn a correction on (TRL),
    else rcdiag's token_truncate at the framework's default threshold (verl, ms-swift, slime: off by default)."""
    fw = FRAMEWORKS[framework]
    built = correction_section(framework, {}, "defaults")
    mode = built.get("mode") or RCDIAG_MODE
    threshold = built.get("threshold")
    if threshold is None and "mode" not in built:
        threshold = next((d for n, (_, d) in fw.settings.items() if n.endswith(("threshold", "clip"))
                          and isinstance(d, int | float)), DEFAULT_THRESHOLD)
    on = " (its correction is off by default; the IS keys show its default threshold at token level)" \
        if not built.get("enabled") else ""
    return TrainerSetting(mode, threshold, built.get("lower"), origin="framework",
                          why=f"{fw.name} {fw.version}'s defaults{on}")


def _recorded(info: Manifest) -> TrainerSetting | None:
    trainer = info.trainer
    section = None if trainer is None else trainer.correction
    if section is None:
        return None
    fw = section.framework or "the trainer"
    said = f"the run's recorded {fw} settings ({_quote(section.settings)}; from {section.source or 'the trainer'})"
    if section.mode not in IS_MODE_TABLE:
        base = framework_setting(section.framework) if section.framework in FRAMEWORKS else None
        if base is None:
            return None
        what = "applied no IS correction" if section.enabled is False else "used an IS rule rcdiag has no name for"
        return TrainerSetting(base.mode, base.threshold, base.lower, tuple(section.rejection), "framework",
                              f"{said}: the trainer {what}, so {base.why}")
    off = "" if section.enabled is not False else \
        " — the correction was off in training; these are the settings it would have applied"
    return TrainerSetting(section.mode, section.threshold, section.lower, tuple(section.rejection), "recorded",
                          said + off)


def choose_correction(info: Any = None, keys: str | None = None, *, mode: str | None = None,
                      threshold: Any = None, lower: Any = None, convention: str | None = None) -> TrainerSetting:
    """The IS setting for `info` (a Manifest, a manifest dict, a Run or None) reported under `keys`: explicit
    `mode` / `threshold` / `lower` win, each on its own; the others come from the run's recorded trainer
    settings, else from the `keys` framework's defaults, else rcdiag's (token_truncate at DEFAULT_THRESHOLD).
    A bound the convention cannot apply (a lower bound under swift, no upper bound outside trl) is dropped and
    named in `notes`. ConfigError for an unknown mode."""
    style = check_keys(keys)
    conv = get_convention(key_convention(style, convention))
    if mode is not None and mode not in IS_MODE_TABLE:
        raise ConfigError(f"unknown IS mode {mode!r}; choose one of {', '.join(IS_MODES)}"
                          f"{did_you_mean(str(mode), IS_MODES, n=1)}")
    manifest = info if isinstance(info, Manifest | dict) else getattr(info, "info", None)  # a Run's typed manifest
    base = _recorded(Manifest.of(manifest)) if isinstance(manifest, Manifest | dict) else None
    if base is None:
        base = framework_setting(KEY_FRAMEWORK[style]) if style in KEY_FRAMEWORK else TrainerSetting(
            RCDIAG_MODE, DEFAULT_THRESHOLD, why="rcdiag's default (no trainer settings recorded, and "
            f"--keys {style} names no framework's)")
    given = {name: value for name, value in (("mode", mode), ("threshold", threshold), ("lower", lower))
             if value is not None}
    inherit_lower = lower is None and threshold is None and mode is None  # a given C or mode drops the trainer's L
    why = base.why if not given else "given" if {"mode", "threshold"} <= set(given) else \
        f"given ({_quote(given)}); the rest from {base.why}"
    chosen = TrainerSetting(mode or base.mode, base.threshold if threshold is None else float(threshold),
                            base.lower if inherit_lower else None if lower is None else float(lower),
                            base.rejection, "given" if given else base.origin, why, base.notes)
    return _fit(chosen, conv)


def _fit(chosen: TrainerSetting, conv: Any) -> TrainerSetting:
    """`chosen` with what `conv` cannot apply dropped and said."""
    notes = list(chosen.notes)
    threshold, lower = chosen.threshold, chosen.lower
    action = IS_MODE_TABLE[chosen.mode][1]
    if threshold is not None and not (math.isfinite(threshold) and threshold > 1):
        raise ConfigError(f"threshold {threshold!r}: the IS threshold C must be a finite number > 1")
    if threshold is None and not conv.no_upper:
        threshold = DEFAULT_THRESHOLD
        notes.append(f"The trainer sets no upper bound (clip_max=None), which only convention trl computes; "
                     f"C={DEFAULT_THRESHOLD:g} is used instead.")
    if lower is not None and action not in conv.allow_lower:
        notes.append(f"The lower bound L={lower:g} is left out: convention {conv.name} has none for {chosen.mode}.")
        lower = None
    if threshold is None and action == "truncate" and lower is None:
        threshold = DEFAULT_THRESHOLD
        notes.append(f"{chosen.mode} with neither bound does nothing; C={DEFAULT_THRESHOLD:g} is used instead.")
    return TrainerSetting(chosen.mode, threshold, lower, chosen.rejection, chosen.origin, chosen.why, tuple(notes))
