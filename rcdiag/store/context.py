"""The context a run carries besides its rows, read from where it can be seen: the model's architecture from a
config (`model_info`), the trainer's own correction settings from its config in its own names
(`correction_section`, one table per framework), and `key=value` settings a user pastes (`parse_settings`).

Every importer, recorder and `rcdiag score` writes these through the typed sections of rcdiag.store.sections; what
no source says stays absent (None), so the verdict can name it as unknown and say what it assumed.
"""
from __future__ import annotations

import math
import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rcdiag.errors import ConfigError, InputError, did_you_mean
from rcdiag.store.manifest import abs_path
from rcdiag.store.routes import EXPERT_KEYS, TOP_K_KEY
from rcdiag.store.safefile import read_json

CONFIG_LIMIT = 4 << 20
"""A config.json larger than this is not a model config (a manifest or option may point anywhere)."""
DTYPE_NAMES = {"bf16": "bfloat16", "fp16": "float16", "half": "float16", "fp32": "float32", "float": "float32",
               "bfloat16": "bfloat16", "float16": "float16", "float32": "float32"}
"""The names trainers' configs give a dtype (verl bf16/fp32, transformers torch_dtype) → the torch name."""


def dtype_name(value: Any) -> str | None:
    """A dtype as the torch name rcdiag records (`torch.bfloat16`, "bf16", "bfloat16" → "bfloat16"); None for
    what names no floating dtype ("auto", None, an int8 quantization)."""
    if value is None:
        return None
    text = str(value).strip().lower().removeprefix("torch.")
    return DTYPE_NAMES.get(text)


# --------------------------------------------------------------------------------------------- architecture
def model_info(source: str | os.PathLike | Mapping[str, Any] | None, *, name: str | None = None,
               where: str | None = None) -> dict[str, Any] | None:
    """The manifest's `model` section (rcdiag.store.sections.ModelInfo) from a model or tokenizer directory (its
    config.json), a config.json file, or a config already loaded (a dict: PretrainedConfig.to_dict(), a dump's
    config); None when there is no config to read (a tokenizer-only directory, a hub id). `name`: the model as the
    source names it; `where`: what read it (default "config.json")."""
    if source is None:
        return None
    config_file = None
    if isinstance(source, Mapping):
        config: Any = dict(source)
    else:
        path = Path(source).expanduser()
        config_file = path / "config.json" if path.is_dir() else path
        if not config_file.is_file():
            return None
        try:
            config = read_json(config_file, "model config", CONFIG_LIMIT)
        except InputError:
            return None  # a damaged or foreign config says nothing about the model; the run stays without it
    if not isinstance(config, dict):
        return None
    inner = config.get("text_config") if isinstance(config.get("text_config"), dict) else config
    experts = next((inner[k] for k in EXPERT_KEYS if _count(inner.get(k))), None)
    top_k = inner.get(TOP_K_KEY) if _count(inner.get(TOP_K_KEY)) else None
    architectures = config.get("architectures")
    info = {
        "architecture": "moe" if experts is not None and experts > 1 else "dense",
        "model_type": _text(config.get("model_type")),
        "architectures": [str(a) for a in architectures] if isinstance(architectures, list) else [],
        "num_experts": experts, "experts_per_token": top_k,
        "config_dtype": dtype_name(config.get("torch_dtype") or config.get("dtype")),
        "name": name or _text(config.get("_name_or_path")) or (None if config_file is None else
                                                                 abs_path(config_file.parent)),
        "config": None if config_file is None else abs_path(config_file),
        "source": where or ("config.json" if config_file is not None else "model config"),
    }
    return {k: v for k, v in info.items() if v not in (None, [])}


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


# --------------------------------------------------------------------------------------------- correction
def _flag(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("true", "1", "yes", "on"):
        return True
    if text in ("false", "0", "no", "off"):
        return False
    raise ValueError("expected true or false")


def _number(value: Any) -> float | None:
    if value is None or str(value).strip().lower() in ("none", "null", ""):
        return None
    if isinstance(value, bool):
        raise ValueError("expected a number")
    number = float(value)
    if not math.isfinite(number):
        raise ValueError("expected a finite number")
    return number


def _band(value: Any) -> float | str | None:
    """A number, or verl's "lower_upper" band string kept as written."""
    if isinstance(value, str) and "_" in value:
        low, _, high = value.strip().partition("_")
        float(low), float(high)  # ValueError when either is not a number
        return value.strip()
    return _number(value)


def _optional(choices: tuple[str, ...]) -> Callable[[Any], str | None]:
    def parse(value: Any) -> str | None:
        if value is None or str(value).strip().lower() in ("none", "null", ""):
            return None
        text = str(value).strip()
        if text not in choices:
            raise ValueError(f"expected one of {', '.join(choices)} (or none){did_you_mean(text, choices, n=1)}")
        return text
    return parse


def _string(value: Any) -> str | None:
    return None if value is None or str(value).strip().lower() in ("none", "null", "") else str(value).strip()


IS_MODE_NAMES = ("token_truncate", "token_mask", "sequence_truncate", "sequence_mask")
"""The IS modes TRL and ms-swift name as rcdiag does (rcdiag.analysis.defaults.IS_MODE_TABLE holds the same
four; store cannot import analysis, tests/store checks that they agree)."""


@dataclass(frozen=True)
class Framework:
    """One trainer's correction settings: name → (parser, the framework's default), and how they read as a
    Correction section (`build`). `version`: the release the names and defaults were read from."""

    name: str
    version: str
    settings: dict[str, tuple[Callable[[Any], Any], Any]]
    build: Callable[[dict[str, Any]], dict[str, Any]]


def _trl(v: dict[str, Any]) -> dict[str, Any]:
    """TRL GRPOTrainer (trl 1.16.0 grpo_trainer.py, _generate_and_score_completions): with the correction on, the
    ratio exp(old − sampling) per token or per sequence (exp of the sum), clamped to [clip_min, clip_max]
    (*_truncate) or zeroed outside it (*_mask); the deprecated `vllm_importance_sampling_cap` replaces clip_max."""
    upper = v["vllm_importance_sampling_cap"] if v["vllm_importance_sampling_cap"] is not None else \
        v["vllm_importance_sampling_clip_max"]
    return {"enabled": v["vllm_importance_sampling_correction"], "mode": v["vllm_importance_sampling_mode"],
            "threshold": upper, "lower": v["vllm_importance_sampling_clip_min"]}


def _verl(v: dict[str, Any]) -> dict[str, Any]:
    """verl algorithm.rollout_correction (verl @ 1dda039, rollout_corr_helper.py): rollout_is token|sequence with
    rollout_is_threshold — one number: truncated IS (TIS); "L_U": IcePop, weights zeroed outside [L, U] — and the
    rejection options rollout_rs with rollout_rs_threshold (one spec shared, or one per option)."""
    level, spec = v["rollout_is"], v["rollout_is_threshold"]
    options = [o.strip() for o in str(v["rollout_rs"] or "").split(",") if o.strip()]
    specs = [s.strip() for s in str(v["rollout_rs_threshold"] or "").split(",") if s.strip()]
    if options and len(specs) not in (1, len(options)):
        raise ValueError(f"rollout_rs_threshold {v['rollout_rs_threshold']!r}: one value shared by all options, "
                         f"or one per option of {v['rollout_rs']!r}")
    rejection = [f"{o}:{s}" for o, s in zip(options, specs * len(options) if len(specs) == 1 else specs,
                                            strict=True)]
    out: dict[str, Any] = {"enabled": level is not None or bool(options), "rejection": rejection,
                           "batch_normalize": v["rollout_is_batch_normalize"]}
    if level is not None and spec is not None:
        band = isinstance(spec, str)
        low, _, high = str(spec).partition("_") if band else ("", "", spec)
        out.update(mode=f"{level}_{'mask' if band else 'truncate'}", threshold=float(high),
                   lower=float(low) if band else None)
    return out


def _swift(v: dict[str, Any]) -> dict[str, Any]:
    """ms-swift GRPO (swift/megatron/arguments/megatron_args.py @ 3602360): rollout_importance_sampling_mode (one of
    the four IS modes, or None: off) at rollout_importance_sampling_threshold."""
    mode = v["rollout_importance_sampling_mode"]
    return {"enabled": mode is not None, "mode": mode,
            "threshold": v["rollout_importance_sampling_threshold"] if mode else None}


def _slime(v: dict[str, Any]) -> dict[str, Any]:
    """slime --use-tis (slime/backends/megatron_utils/loss.py @ 624b824): token ratios clamped to
    [--tis-clip-low, --tis-clip]; a --custom-tis-function-path replaces that rule (mode unknown)."""
    if not v["use_tis"]:
        return {"enabled": False}
    if v["custom_tis_function_path"]:
        return {"enabled": True}
    low = v["tis_clip_low"]
    return {"enabled": True, "mode": "token_truncate", "threshold": v["tis_clip"], "lower": low if low else None}


FRAMEWORKS: dict[str, Framework] = {f.name: f for f in (
    Framework("trl", "1.16.0", {
        "vllm_importance_sampling_correction": (_flag, True),
        "vllm_importance_sampling_mode": (_optional(IS_MODE_NAMES), "sequence_mask"),
        "vllm_importance_sampling_clip_max": (_number, 3.0),
        "vllm_importance_sampling_clip_min": (_number, None),
        "vllm_importance_sampling_cap": (_number, None)}, _trl),
    Framework("verl", "0.10.0.dev @ 1dda039", {
        "rollout_is": (_optional(("token", "sequence")), None),
        "rollout_is_threshold": (_band, 2.0),
        "rollout_rs": (_string, None),
        "rollout_rs_threshold": (_string, None),
        "rollout_is_batch_normalize": (_flag, False),
        "bypass_mode": (_flag, False)}, _verl),
    Framework("swift", "4.5 @ 3602360", {
        "rollout_importance_sampling_mode": (_optional(IS_MODE_NAMES), None),
        "rollout_importance_sampling_threshold": (_number, 2.0)}, _swift),
    Framework("slime", "@ 624b824", {
        "use_tis": (_flag, False), "tis_clip": (_number, 2.0), "tis_clip_low": (_number, 0.0),
        "custom_tis_function_path": (_string, None)}, _slime),
)}
"""THE table of trainers' correction settings: each framework's names, parsers and defaults (read from its source at
the version named), and how they read in rcdiag's vocabulary. Adding a framework is one entry."""
SETTING_OWNER = {name: fw.name for fw in FRAMEWORKS.values() for name in fw.settings}
"""Setting name → the framework that owns it (the names do not overlap)."""


def correction_section(framework: str, given: Mapping[str, Any], source: str) -> dict[str, Any]:
    """The manifest's `trainer.correction` (rcdiag.store.sections.Correction) from a framework's settings in its
    own names (missing ones at the framework's defaults, recorded as such in `settings`). ConfigError naming the
    setting and what it accepts for a value the framework would refuse."""
    fw = FRAMEWORKS[framework]
    values: dict[str, Any] = {}
    for name, (parse, default) in fw.settings.items():
        raw = given.get(name, default)
        try:
            values[name] = default if raw is None and default is None else parse(raw)
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"{framework} setting {name}={raw!r}: {exc}") from None
    try:
        built = fw.build(values)
    except ValueError as exc:
        raise ConfigError(f"{framework} settings: {exc}") from None
    defaulted = sorted(name for name in fw.settings if name not in given)
    section = {"framework": framework, **built, "settings": values, "source": source}
    if defaulted:
        section["defaulted"] = defaulted  # kept in extra: which values are the framework's defaults, not read
    return section


def parse_settings(items: Iterable[str], option: str = "--trainer-setting") -> tuple[str, dict[str, Any]] | None:
    """(framework, {name: value}) from `name=value` strings in one framework's own names (TRL
    vllm_importance_sampling_mode=sequence_mask, verl rollout_is=token, ms-swift
    rollout_importance_sampling_threshold=2, slime use_tis=true …); None for none. ConfigError for an unknown
    name (with the close ones), a malformed item, or names of two frameworks."""
    settings: dict[str, Any] = {}
    owners = set()
    for item in items:
        name, sep, value = str(item).partition("=")
        name = name.strip().lstrip("-").replace("-", "_")
        if not sep or not name:
            raise ConfigError(f"{option} {item!r}: expected NAME=VALUE, e.g. vllm_importance_sampling_mode="
                              "sequence_mask")
        if name not in SETTING_OWNER:
            raise ConfigError(f"{option} {item!r}: {name!r} is not a correction setting rcdiag reads"
                              f"{did_you_mean(name, SETTING_OWNER, n=1)}; known: " + "; ".join(
                                  f"{fw.name}: {', '.join(fw.settings)}" for fw in FRAMEWORKS.values()))
        settings[name] = value.strip()
        owners.add(SETTING_OWNER[name])
    if not settings:
        return None
    if len(owners) > 1:
        raise ConfigError(f"{option}: settings of {' and '.join(sorted(owners))} mixed; a run has one trainer")
    return owners.pop(), settings
