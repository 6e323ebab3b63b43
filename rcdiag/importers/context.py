"""What an import knows about the run besides its rows: the context options of `rcdiag import` (what the dump cannot
say: the engine's dtype, quantization and KV-cache dtype, the sampling temperature/top-p/top-k, the model's
architecture, the trainer's own correction settings in its framework's names) and the model's config where a
`--model` or `--tokenizer` directory has one. `apply_context` writes them into the import's manifest sections, with
`provenance` naming each as stated by the user, and drops the `lacks` line a stated fact answers.

A dump's own statements are kept where it has them (verl's meta_info temperature); a stated option that
contradicts one is refused, naming both — a run never carries two answers.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from rcdiag.errors import ConfigError
from rcdiag.store.context import correction_section, dtype_name, model_info, parse_settings
from rcdiag.store.sections import ARCHITECTURES

FORMAT_FRAMEWORK = {"verl": "verl", "verl-text": "verl", "trl": "trl", "swift": "swift", "slime": "slime",
                    "miles": "slime", "nemo-rl": "nemo-rl", "prime-rl": "prime-rl"}
"""Import format → the RL framework that wrote it (trainer.framework)."""
ENGINE_DTYPES = ("bfloat16", "float16", "float32")


@dataclass(frozen=True)
class ImportContext:
    """The context options of `rcdiag import` (each default: not stated)."""

    engine_dtype: str | None = None
    trainer_dtype: str | None = None
    quantization: str | None = None
    kv_cache_dtype: str | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    architecture: str | None = None
    model: str | None = None
    trainer_settings: tuple[str, ...] = field(default_factory=tuple)

    def __post_init__(self) -> None:
        for name in ("engine_dtype", "trainer_dtype"):
            value = getattr(self, name)
            if value is not None and dtype_name(value) not in ENGINE_DTYPES:
                raise ConfigError(f"--{name.replace('_', '-')} {value!r} is not one of {', '.join(ENGINE_DTYPES)} "
                                  "(or bf16, fp16, fp32)")
            object.__setattr__(self, name, dtype_name(value))
        if self.architecture is not None and self.architecture not in ARCHITECTURES:
            raise ConfigError(f"--architecture {self.architecture!r}: one of {', '.join(ARCHITECTURES)}")
        if self.temperature is not None and not self.temperature > 0:
            raise ConfigError(f"--temperature must be > 0, got {self.temperature}")
        if self.top_p is not None and not 0 < self.top_p <= 1:
            raise ConfigError(f"--top-p must be in (0, 1], got {self.top_p}")
        object.__setattr__(self, "trainer_settings", tuple(self.trainer_settings))
        parse_settings(self.trainer_settings)  # refused now, before the dump is read


STATED = "rcdiag import (user: --{})"


def apply_context(imported: Any, context: ImportContext, tokenizer: str | None) -> None:
    """Write the import's context sections (module docstring) into `imported.sections` (an importers.common.Imported:
    not imported here, since common holds the ImportContext of its ImportOptions)."""
    sections, provenance = imported.sections, imported.sections.setdefault("provenance", {})
    engine = sections.setdefault("engine", {})
    meta = imported.conventions.get("meta_info") if isinstance(imported.conventions.get("meta_info"), dict) else {}
    if isinstance(meta.get("temperature"), int | float) and not isinstance(meta["temperature"], bool):
        engine.setdefault("temperature", float(meta["temperature"]))
        provenance.setdefault("engine.temperature", f"the dump's meta_info ({imported.fmt})")
    stated = {"engine_dtype": context.engine_dtype, "quantization": context.quantization,
              "kv_cache_dtype": context.kv_cache_dtype, "temperature": context.temperature,
              "top_p": context.top_p, "top_k": context.top_k}
    for name, value in stated.items():
        if value is None:
            continue
        if engine.get(name) is not None and engine[name] != value:
            raise ConfigError(f"--{name.replace('_', '-')} {value!r}: the dump says engine {name} "
                              f"{engine[name]!r} ({provenance.get(f'engine.{name}', 'its own record')})")
        engine[name] = value
        provenance[f"engine.{name}"] = STATED.format(name.replace("_", "-"))
    trainer = sections.setdefault("trainer", {})
    if imported.fmt in FORMAT_FRAMEWORK:
        trainer.setdefault("framework", FORMAT_FRAMEWORK[imported.fmt])
    if context.trainer_dtype is not None:
        trainer["dtype"] = context.trainer_dtype
        provenance["trainer.dtype"] = STATED.format("trainer-dtype")
    settings = parse_settings(context.trainer_settings)
    if settings is not None:
        framework, values = settings
        trainer["correction"] = correction_section(framework, values, "rcdiag import --trainer-setting")
        provenance["trainer.correction"] = STATED.format("trainer-setting")
    _model(sections, provenance, context, tokenizer)
    for name in ("engine", "trainer"):
        if not sections[name]:
            del sections[name]
    if not provenance:
        del sections["provenance"]
    if context.temperature is not None:
        imported.lacks = [_answered(item, context) for item in imported.lacks]


def _model(sections: dict[str, Any], provenance: dict[str, str], context: ImportContext,
           tokenizer: str | None) -> None:
    """The `model` section: --model's config, else --tokenizer's (a policy's tokenizer directory usually holds its
    config.json), else what the dump said; --architecture states it outright (and must agree with a config)."""
    for option, path in (("--model", context.model), ("--tokenizer", tokenizer)):
        info = model_info(path, where=f"config.json of {option}") if path else None
        if info:
            sections["model"] = info
            provenance["model"] = f"{info.get('config')} ({option})"
            break
    if context.model and "model" not in sections:
        raise ConfigError(f"--model {context.model!r}: no config.json there to read the architecture from; pass "
                          "--architecture dense|moe instead")
    if context.architecture is None:
        return
    found = sections.get("model", {}).get("architecture")
    if found is not None and found != context.architecture:
        raise ConfigError(f"--architecture {context.architecture}: the model's config says {found} "
                          f"({sections['model'].get('config')})")
    sections.setdefault("model", {})["architecture"] = context.architecture
    provenance.setdefault("model", STATED.format("architecture"))


def _answered(item: str, context: ImportContext) -> str:
    """A `lacks` line about the sampling settings, less what the options stated."""
    if not item.startswith("sampling settings"):
        return item
    return f"{item} — temperature given: T={context.temperature:g}"
