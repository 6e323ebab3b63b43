"""The one-line context of a run, from its manifest: engine (vLLM version, dtype, quantization, temperature,
top-p/top-k, logprobs mode) → trainer (transformers version, dtype, attention), or the importer and its source;
and what the verdict knows from it (each side's precision, the architecture, what the run does not record).

All manifest reading of the verdict's surfaces (report, dashboard Overview, notebook card) is here, on the typed
manifest (rcdiag.store.manifest.Manifest; a dict is validated into one). A fact a newer writer records in a typed
field and an older one left among the section's extras reads the same (`recorded`).
"""
from __future__ import annotations

from typing import Any

from rcdiag.analysis.metrics.precision import Precision
from rcdiag.store.context import model_info
from rcdiag.store.manifest import Engine, Manifest, Trainer


def _info(manifest: Any) -> Manifest:
    return Manifest.of(manifest if isinstance(manifest, Manifest | dict) else None)


def recorded(section: Any, *names: str) -> Any:
    """The first of `names` a manifest section records: its typed field, else its extras (None: not recorded)."""
    if section is None:
        return None
    for name in names:
        value = getattr(section, name, None)
        if value is None:
            value = getattr(section, "extra", {}).get(name)
        if value is not None:
            return value
    return None


def _engine(info: Manifest) -> Engine:
    return info.engine or Engine()


def _trainer(info: Manifest) -> Trainer:
    return info.trainer or Trainer()


def run_context(manifest: Any) -> dict[str, Any]:
    """The context facts of a manifest: {'importer', 'source', 'engine': {...}, 'trainer': {...}} (None where
    the manifest does not record a fact). The engine's dtype is the one it resolved (`dtype_resolved`: 'auto'
    → bfloat16), else the one requested."""
    info = _info(manifest)
    engine, trainer = _engine(info), _trainer(info)
    kind = str(info.source.kind or "")
    return {
        "importer": kind.split(":", 1)[1] if kind.startswith("imported:") else None,
        "source": info.source.path,
        "engine": {"name": engine.name, "version": recorded(engine, "version", "vllm_version"),
                   "dtype": recorded(engine, "dtype_resolved", "dtype", "engine_dtype"),
                   "quantization": recorded(engine, "quantization"),
                   "kv_cache_dtype": recorded(engine, "kv_cache_dtype"), "temperature": engine.temperature,
                   "top_p": engine.top_p, "top_k": engine.top_k, "logprobs_mode": engine.logprobs_mode},
        "trainer": {"transformers": recorded(trainer, "transformers_version"),
                    "dtype": recorded(trainer, "dtype_resolved", "dtype"), "attention": trainer.attn_implementation,
                    "temperature": trainer.temperature, "device": recorded(trainer, "device")},
    }


def _g(x: Any) -> str:
    return f"{x:g}" if isinstance(x, int | float) and not isinstance(x, bool) else str(x)


def _side(side: str, name: str, details: str) -> str:
    if not name and not details:
        return f"{side} (not recorded)"
    return " ".join(x for x in (side, name, f"({details})" if name and details else details) if x)


def _join(parts: list[Any]) -> str:
    return ", ".join(p for p in parts if p)


def context_line(manifest: Any) -> str:
    """'engine vLLM 0.10.1 (bfloat16, T=1, top-p 1, top-k off, processed_logprobs) → trainer transformers 4.56
    (float32, sdpa, cpu)'; for an imported run, the importer and its source first."""
    facts = run_context(manifest)
    e, t = facts["engine"], facts["trainer"]
    top_k = e["top_k"]
    quant = _join([e["quantization"] and f"{e['quantization']} weights",
                   e["kv_cache_dtype"] not in (None, "auto") and f"{e['kv_cache_dtype']} KV cache"])
    engine = _join([e["dtype"] and str(e["dtype"]), quant,
                    e["temperature"] is not None and f"T={_g(e['temperature'])}",
                    e["top_p"] is not None and f"top-p {_g(e['top_p'])}",
                    top_k is not None and (f"top-k {top_k}" if isinstance(top_k, int) and top_k > 0 else "top-k off"),
                    e["logprobs_mode"] and str(e["logprobs_mode"])])
    name = " ".join(str(x) for x in (e["name"] if e["name"] != "vllm" else "vLLM", e["version"]) if x)
    trainer = _join([t["dtype"] and str(t["dtype"]), t["attention"] and str(t["attention"]),
                     t["temperature"] is not None and f"T={_g(t['temperature'])}", t["device"] and str(t["device"])])
    tname = f"transformers {t['transformers']}" if t["transformers"] else ""
    line = f"{_side('engine', name, engine)} → {_side('trainer', tname, trainer)}" + measured_note(manifest)
    if facts["importer"]:
        line = f"imported by {facts['importer']} from {facts['source'] or '(source not recorded)'} · " + line
    return line


def measured_note(manifest: Any) -> str:
    """' · rollout = prefill replay of the text' (or '… of the stored tokens') where the rollout side is vLLM
    re-reading tokens rather than the log-probs the rollout sampled with; ' · trainer = π_θ at the micro-step'
    where the trainer side is not π_old (rcdiag.store.manifest.Measured)."""
    info = _info(manifest)
    notes = []
    if info.measured.rollout == "prefill_replay":
        notes.append("rollout = prefill replay of " + ("the text" if info.source.retokenized else
                                                       "the stored tokens"))
    if info.measured.trainer == "pi_theta_microstep":
        notes.append("trainer = π_θ at the micro-step (not π_old)")
    return "".join(f" · {n}" for n in notes)


def side_dtypes(manifest: Any) -> tuple[Any, Any]:
    """(engine dtype, trainer dtype) as resolved where recorded (the engine's `dtype_resolved` before a requested
    'auto'); None where not recorded."""
    info = _info(manifest)
    return (recorded(_engine(info), "dtype_resolved", "dtype", "engine_dtype"),
            recorded(_trainer(info), "dtype_resolved", "dtype"))


def precision(manifest: Any) -> Precision:
    """Each side's precision as the run records it (rcdiag.analysis.metrics.precision: unrecorded parts are None,
    and the floor assumes bfloat16 for them, saying so)."""
    info = _info(manifest)
    engine_dtype, trainer_dtype = side_dtypes(info)
    return Precision.of(engine_dtype, trainer_dtype, recorded(_engine(info), "quantization"),
                        recorded(_engine(info), "kv_cache_dtype"))


def engine_replayed(manifest: Any) -> bool:
    """Whether the rollout log-probs are a prefill replay of given tokens (`rcdiag score --rescore-both`), not what
    the rollout sampled with."""
    info = _info(manifest)
    return info.measured.rollout == "prefill_replay" or bool(_engine(info).replayed)


def unrecorded(manifest: Any) -> tuple[str, ...]:
    """What else the verdict would want and the run does not record (beyond the dtypes and the architecture, which
    the verdict names itself): the sampling settings."""
    engine = _engine(_info(manifest))
    # a writer that records top-p but leaves top-k unset means "off" (rcdiag score stores top_k ≤ 0 as None)
    top_k = engine.top_k if engine.top_p is None else (engine.top_k if engine.top_k is not None else -1)
    missing = [name for name, value in (("temperature", engine.temperature), ("top-p", engine.top_p),
                                         ("top-k", top_k), ("logprobs mode", engine.logprobs_mode))
               if value is None]
    if not missing:
        return ()
    return (f"{', '.join(missing)} (the checks read them from the data alone)",)


def architecture(manifest: Any) -> str | None:
    """'moe' or 'dense' for the run's model — from the manifest where it records it (its `model` section first),
    else from the model directory's config.json (rcdiag.store.context.model_info: a bounded regular file); None when
    unknown (most imports)."""
    info = _info(manifest)
    sections = [info.model, info.engine, info.trainer, *info.models.values()]
    spec = info.extra.get("spec")
    for section in sections:
        found = recorded(section, "architecture")
        if found in ("moe", "dense"):
            return found
    if isinstance(spec, dict) and spec.get("architecture") in ("moe", "dense"):
        return spec["architecture"]
    models = [recorded(info.model, "config"), recorded(info.trainer, "model"), recorded(info.engine, "model"),
              spec.get("model") if isinstance(spec, dict) else None,
              *(ref.path for ref in info.models.values())]
    for model in models:
        if isinstance(model, str) and model:
            found = model_info(model)
            if found is not None:
                return found["architecture"]
    return None
