"""The one-line context of a run, from its manifest: engine (vLLM version, dtype, temperature, top-p/top-k,
logprobs mode) → trainer (transformers version, dtype, attention), or the importer and its source.

All manifest reading of the verdict's surfaces (report, dashboard Overview, notebook card) is here — `run_context`,
`side_dtypes`, `engine_replayed`, `architecture` — read defensively with .get, so that a typed manifest reader
(rcdiag.store.manifest) can replace it in one place.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def _section(manifest: Any, name: str) -> dict[str, Any]:
    value = manifest.get(name) if isinstance(manifest, dict) else None
    return value if isinstance(value, dict) else {}


def run_context(manifest: Any) -> dict[str, Any]:
    """The context facts of a manifest: {'importer', 'source', 'engine': {...}, 'trainer': {...}} (None where
    the manifest does not record a fact). The engine's dtype is the one it resolved (`dtype_resolved`: 'auto'
    → bfloat16), else the one requested."""
    engine, trainer, source = (_section(manifest, k) for k in ("engine", "trainer", "source"))
    sampling = engine.get("sampling") if isinstance(engine.get("sampling"), dict) else {}

    def pick(*keys: str, where: tuple[dict[str, Any], ...] = (engine, sampling)) -> Any:
        return next((d[k] for d in where for k in keys if d.get(k) is not None), None)

    kind = str(source.get("kind") or "")
    return {
        "importer": kind.split(":", 1)[1] if kind.startswith("imported:") else None,
        "source": source.get("path"),
        "engine": {"name": pick("name"), "version": pick("version", "vllm_version"),
                   "dtype": pick("dtype_resolved", "dtype", "engine_dtype"), "temperature": pick("temperature"),
                   "top_p": pick("top_p"), "top_k": pick("top_k"), "logprobs_mode": pick("logprobs_mode")},
        "trainer": {"transformers": trainer.get("transformers_version"), "dtype": trainer.get("dtype"),
                    "attention": trainer.get("attn_implementation"), "temperature": trainer.get("temperature"),
                    "device": trainer.get("device")},
    }


def _g(x: Any) -> str:
    return f"{x:g}" if isinstance(x, int | float) and not isinstance(x, bool) else str(x)


def _side(side: str, name: str, details: str) -> str:
    if not name and not details:
        return f"{side} (not recorded)"
    return " ".join(x for x in (side, name, f"({details})" if name and details else details) if x)


def _join(parts: list[str]) -> str:
    return ", ".join(p for p in parts if p)


def context_line(manifest: Any) -> str:
    """'engine vLLM 0.10.1 (bfloat16, T=1, top-p 1, top-k off, processed_logprobs) → trainer transformers 4.56
    (float32, sdpa, cpu)'; for an imported run, the importer and its source first."""
    facts = run_context(manifest)
    e, t = facts["engine"], facts["trainer"]
    top_k = e["top_k"]
    engine = _join([e["dtype"] and str(e["dtype"]), e["temperature"] is not None and f"T={_g(e['temperature'])}",
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
    measured, source = _section(manifest, "measured"), _section(manifest, "source")
    notes = []
    if measured.get("rollout") == "prefill_replay":
        notes.append("rollout = prefill replay of " + ("the text" if source.get("retokenized") else
                                                       "the stored tokens"))
    if measured.get("trainer") == "pi_theta_microstep":
        notes.append("trainer = π_θ at the micro-step (not π_old)")
    return "".join(f" · {n}" for n in notes)


def side_dtypes(manifest: Any) -> tuple[Any, Any]:
    """(engine dtype, trainer dtype) as resolved where recorded (the engine's `dtype_resolved` before a requested
    'auto'); None where not recorded."""
    engine, trainer = _section(manifest, "engine"), _section(manifest, "trainer")
    return (engine.get("dtype_resolved") or engine.get("dtype") or engine.get("engine_dtype"),
            trainer.get("dtype_resolved") or trainer.get("dtype"))


def engine_replayed(manifest: Any) -> bool:
    """Whether the rollout log-probs are a prefill replay of given tokens (`rcdiag score --rescore-both`), not what
    the rollout sampled with."""
    engine, measured = _section(manifest, "engine"), _section(manifest, "measured")
    return measured.get("rollout") == "prefill_replay" or bool(engine.get("replayed"))


MOE_KEYS = ("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts", "num_experts_per_tok")
"""config.json keys that make a model a mixture of experts (Qwen2/3-MoE, Mixtral, DeepSeek, OLMoE …)."""
CONFIG_LIMIT = 1 << 20
"""A config.json larger than this is not read (a manifest may point anywhere)."""


def architecture(manifest: Any) -> str | None:
    """'moe' or 'dense' for the run's model — from the manifest where it records it, else from the model
    directory's config.json (a regular file under CONFIG_LIMIT bytes); None when unknown (most imports)."""
    for name in ("engine", "trainer", "models", "spec"):
        recorded = _section(manifest, name).get("architecture")
        if recorded in ("moe", "dense"):
            return recorded
    for name in ("trainer", "engine", "spec"):
        model = _section(manifest, name).get("model")
        if not isinstance(model, str) or not model:
            continue
        config = Path(model) / "config.json"
        try:
            if not config.is_file() or config.stat().st_size > CONFIG_LIMIT:
                continue
            data = json.loads(config.read_text(encoding="utf-8"))
        except (OSError, ValueError, UnicodeDecodeError):
            continue
        if isinstance(data, dict):
            inner = data.get("text_config") if isinstance(data.get("text_config"), dict) else data
            return "moe" if any(isinstance(inner.get(k), int) and inner[k] > 1 for k in MOE_KEYS) else "dense"
    return None
