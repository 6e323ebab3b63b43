"""Distances between a probe's settings and the mismatch budget: how much of the observed gap each factor explains.

Every distance compares two log-prob columns x (the setting) and y (the comparison point) over the valid tokens,
with `rcdiag.compute_metrics` on a frame `train_logprob = y, rollout_logprob = x` (so `kl` = E_tok[x − y], as for
a rollout x against a trainer y), plus exact |ℓ| statistics in float64: mean, p99, max, and the share of tokens
with |ℓ| > 0.1.

**Mismatch budget.** The observed gap is the run's rollout log-probs against the reference trainer (float32, one
sequence at a time): G = mean |rollout − reference|. A setting's *share* is mean |setting − baseline| / G, where
the baseline differs from the setting in exactly one factor — "this factor alone moves log-probs by that fraction
of the observed gap, per token on average". Shares are not additive (effects can cancel or compound, and |·| is
sub-additive) and can exceed 1; `share_k3` does the same with k3_kl.

**Residual gap if you change X** (what the probe answers with, `rcdiag.probe.answer`): the gap left if the run
changed this one setting — for an engine setting, mean |setting − reference| (the engine so configured against the
float32 trainer; measured by prefill, so decode-path differences are gone too), for a trainer setting, mean
|rollout − setting| — as a fraction of G; `removes` = 1 − residual. Unlike shares these answer "what would I get".
"""
from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import asdict
from typing import Any

import numpy as np
import pandas as pd

from rcdiag.probe.factors import ENGINE_RUN, REFERENCE, ROLLOUT, Setting, setting_record
from rcdiag.store.manifest import Engine

CHANGES = {"engine_replay": "engine scores by prefill (its own replay) instead of decode",
           "engine_float32": "engine in float32", "engine_bfloat16": "engine in bfloat16",
           "engine_alone": "engine with one request per batch", "engine_cached_prompt": "engine reads the prefix cache",
           "train_bf16": "trainer in bfloat16", "train_fp16": "trainer in float16",
           "attn_eager_alone": "trainer attention eager instead of sdpa_varlen", "attn_sdpa": "trainer packed, sdpa",
           "attn_eager": "trainer packed, eager attention", "attn_flex": "trainer packed, flex attention",
           "packed_4096": "trainer packs rows of 4096 tokens", "packed_512": "trainer packs rows of 512 tokens",
           "train_bf16_packed_4096": "bf16 trainer packs rows of 4096 tokens", "chunk_16": "trainer LM head in chunks of 16",
           "router_replay": "trainer replays the engine's expert choices (routing replay, R3)",
           "router_bf16": "trainer routers in bfloat16", "train_bf16_router_fp32": "bf16 trainer with float32 routers"}
"""What changing to each setting means, in the words of the budget's "residual gap if you change X" column."""
KERNEL_FLOOR_SETTINGS = ("attn_eager_alone", "attn_sdpa", "attn_eager", "chunk_16")
"""float32 trainer settings that change only summation order: their max |Δ| is the kernels' own noise floor."""
LEAK_FACTOR = 10.0
"""A packed float32 setting leaks across sequences when its max |Δ| exceeds this many times the kernel floor."""
ABS_THRESHOLD = 0.1
"""|ℓ| above this counts in `frac_abs_gt_0.1` (a ratio outside about [0.905, 1.105])."""
DISTANCE_NAMES = ("kl", "k3_kl", "mean_abs", "p99_abs", "max_abs", "frac_abs_gt_0.1")


def distance(frame: pd.DataFrame, x: str, y: str) -> dict[str, float]:
    """Distance of column `x` from column `y` over rows with mask True (see the module doc for orientation).

    Returns DISTANCE_NAMES plus `tokens`; all NaN (tokens 0) when no token is valid."""
    from rcdiag.analysis.metrics.compute import compute_metrics

    data = pd.DataFrame({"seq_id": frame["seq_id"], "pos": frame["pos"], "train_logprob": frame[y],
                         "rollout_logprob": frame[x], "mask": frame["mask"]})
    valid = frame["mask"].to_numpy(dtype=bool)
    ell = np.abs(frame[x].to_numpy(np.float64)[valid] - frame[y].to_numpy(np.float64)[valid])
    if ell.size == 0:
        return {**{k: math.nan for k in DISTANCE_NAMES}, "tokens": 0}
    metrics = compute_metrics(data)
    return {"kl": float(metrics["kl"]), "k3_kl": float(metrics["k3_kl"]), "mean_abs": float(ell.mean()),
            "p99_abs": float(np.quantile(ell, 0.99)), "max_abs": float(ell.max()),
            "frac_abs_gt_0.1": float((ell > ABS_THRESHOLD).mean()), "tokens": int(ell.size)}


def _rollout_record(has_replay: bool) -> dict[str, Any]:
    return {"name": ROLLOUT, "factor": "decode_vs_prefill" if has_replay else "rollout", "side": "engine",
            "baseline": ENGINE_RUN if has_replay else REFERENCE,
            "description": "the run's rollout log-probs (vLLM decode at the run's settings)"}


def setting_rows(frame: pd.DataFrame, settings: Sequence[Setting]) -> list[dict[str, Any]]:
    """One record per setting plus the rollout: description, and distances to its baseline, the reference and
    the rollout."""
    names = {s.name for s in settings}
    records = [setting_record(s) for s in settings] + [_rollout_record(ENGINE_RUN in names)]
    for record in records:
        name = record["name"]
        record["vs_baseline"] = None if name == REFERENCE else distance(frame, name, record["baseline"])
        record["vs_reference"] = distance(frame, name, REFERENCE)
        record["vs_rollout"] = distance(frame, ROLLOUT, name) if name != ROLLOUT else None
    return records


def residual(row: dict[str, Any]) -> float:
    """The gap left if the run changed this one setting: an engine setting against the reference trainer
    (mean |setting − reference|), a trainer setting against the rollout (mean |rollout − setting|)."""
    if row["name"] in (REFERENCE, ROLLOUT):
        return math.nan
    against = row.get("vs_reference") if row["side"] == "engine" else row.get("vs_rollout")
    return float((against or {}).get("mean_abs", math.nan))


def budget(rows: Sequence[dict[str, Any]]) -> tuple[dict[str, float], list[dict[str, Any]]]:
    """(the observed gap, one budget row per setting) — see the module doc. Each row has the factor's effect
    (mean |setting − baseline|), its `share` of the gap, and the `residual` gap if the run changed this setting
    (as a fraction of the gap; `removes` = 1 − residual; None for the rollout itself). Fractions are NaN when
    the gap is 0."""
    rollout = next(r for r in rows if r["name"] == ROLLOUT)
    gap = {"mean_abs": rollout["vs_reference"]["mean_abs"], "k3_kl": rollout["vs_reference"]["k3_kl"],
           "kl": rollout["vs_reference"]["kl"]}
    out = []
    for row in rows:
        if row["vs_baseline"] is None:
            continue
        effect, left = row["vs_baseline"], residual(row)
        fraction = _share(left, gap["mean_abs"])
        finite = math.isfinite(fraction)
        out.append({"factor": row["factor"], "setting": row["name"], "baseline": row["baseline"],
                    "side": row["side"], "change": CHANGES.get(row["name"], row.get("description", "")),
                    "mean_abs": effect["mean_abs"], "k3_kl": effect["k3_kl"],
                    "share": _share(effect["mean_abs"], gap["mean_abs"]),
                    "share_k3": _share(effect["k3_kl"], gap["k3_kl"]),
                    "residual_mean_abs": left if finite else None, "residual": fraction if finite else None,
                    "removes": 1 - fraction if finite else None})
    return gap, out


def _share(value: float, total: float) -> float:
    return value / total if total > 0 and math.isfinite(total) else math.nan


def kernel_floor(by_name: dict[str, dict[str, Any]]) -> tuple[str, float] | None:
    """(setting, max |Δ| vs its baseline) of the largest float32 kernel-only change in the probe (attention
    implementation, LM-head chunking): how far float32 summation order alone moves a log-prob on this model. None
    when the probe ran none."""
    found = [(n, by_name[n]["vs_baseline"]["max_abs"]) for n in KERNEL_FLOOR_SETTINGS if n in by_name]
    found = [(n, v) for n, v in found if math.isfinite(v) and v > 0]  # 0: the same kernel, not a floor
    return max(found, key=lambda item: item[1]) if found else None


def packing_note(name: str, max_abs: float, floor: tuple[str, float] | None) -> str:
    """Whether packing leaks across sequences, judged against the kernels' own noise floor on this model (a
    30-layer model's float32 kernels differ by ~3e-5, a 4-layer one's by ~4e-6: a fixed 1e-6 cried wolf)."""
    if floor is None:
        return (f"float32 {name} vs alone: max |Δ| {max_abs:.3g} (no kernel-only setting in this probe to judge "
                "it against; add --factors attention)")
    setting, level = floor
    if max_abs <= LEAK_FACTOR * max(level, 1e-7):
        return (f"float32 {name} vs alone: max |Δ| {max_abs:.3g}, within the kernels' own noise on this model "
                f"({setting} alone moves log-probs by up to {level:.3g}): packing does not leak across sequences")
    return (f"float32 {name} vs alone: max |Δ| {max_abs:.3g}, {max_abs / max(level, 1e-12):.0f}× the kernels' own "
            f"noise ({setting}: {level:.3g}): the packed path leaks across sequences — please report it")


def notes(rows: Sequence[dict[str, Any]], engine_facts: dict[str, dict[str, Any]]) -> list[str]:
    """Plain-language observations a reader should not miss (prefill vs decode, packing exactness, whether the
    prefix cache was actually hit)."""
    by_name = {r["name"]: r for r in rows}
    out = []
    if ENGINE_RUN in by_name:
        d = by_name[ROLLOUT]["vs_baseline"]
        out.append(f"decode vs prefill: the run's sampled log-probs differ from the engine's own prefill replay at "
                   f"the run's settings by mean |ℓ| {d['mean_abs']:.3g}, max {d['max_abs']:.3g} "
                   f"(kl {d['kl']:.3g}); the replay is not the rollout")
    floor = kernel_floor(by_name)
    for name in ("packed_512", "packed_4096"):
        if name in by_name:
            out.append(packing_note(name, by_name[name]["vs_baseline"]["max_abs"], floor))
    cached = engine_facts.get("engine_cached_prompt")
    if cached:
        out.append(f"prefix caching: vLLM never reads the prefix cache for prompt-log-prob requests, so "
                   f"`engine_cached_prompt` first caches each prompt, then scores the response against that cached "
                   f"KV (as n samples per prompt do in a rollout): {cached.get('cached_tokens', 0):,} of "
                   f"{cached.get('tokens', 0):,} tokens were read from the cache (block size "
                   f"{cached.get('block_size')}; prompts shorter than a block are never cached)")
    return out


def summarize(frame: pd.DataFrame, settings: Sequence[Setting], *, run: Any, config: Any, temperature: float,
              seconds: float, engine_facts: dict[str, dict[str, Any]] | None = None,
              divergence: dict[str, Any] | None = None, device: str | None = None, grid: str | None = None,
              extra_notes: Sequence[str] = (), routing: dict[str, Any] | None = None) -> dict[str, Any]:
    """The probe's JSON summary: what was probed, every setting's distances, the budget, notes (with
    `extra_notes`: skipped factors), the exact divergences of whole distributions (rcdiag.probe.divergence; None
    when not measured) and, on an MoE probe, `routing` (rcdiag.probe.routing.routing_record)."""
    rows = setting_rows(frame, settings)
    gap, table = budget(rows)
    valid = frame["mask"].to_numpy(dtype=bool)
    return {
        "name": config.name, "run": str(run.path), "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "config": asdict(config), "temperature": temperature,
        "sample": {"sequences": int(frame["seq_id"].nunique()), "tokens": int(len(frame)),
                   "valid_tokens": int(valid.sum()), "run_sequences": run.num_sequences},
        "engine": {k: getattr(run.info.engine or Engine(), k) for k in
                   ("model", "engine_dtype", "dtype_resolved", "enable_prefix_caching", "version")},
        "engine_settings": engine_facts or {},
        "reference": REFERENCE, "gap": gap, "settings": rows, "budget": table,
        "notes": [*notes(rows, engine_facts or {}), *extra_notes], "divergence": divergence, "routing": routing, "device": device, "grid": grid,
        "attribution": "residual = the gap left if the run changed this setting (engine setting vs the reference "
                       "trainer, trainer setting vs the rollout) ÷ mean |rollout − reference|; share = mean "
                       "|setting − baseline| ÷ the same gap (see rcdiag.probe.summary)",
        "seconds": round(seconds, 1),
    }


BUDGET_COLUMNS = ["factor", "setting", "baseline", "side", "change", "mean_abs", "k3_kl", "share", "share_k3",
                  "residual_mean_abs", "residual", "removes"]


def budget_frame(summary: dict[str, Any]) -> pd.DataFrame:
    """The budget as a DataFrame (BUDGET_COLUMNS; NaN for the residual columns of probes made before them)."""
    return pd.DataFrame(summary.get("budget") or [], columns=BUDGET_COLUMNS)


def settings_frame(summary: dict[str, Any], against: str = "vs_reference") -> pd.DataFrame:
    """One row per setting: name, factor, side, description and its distances `against` (vs_reference |
    vs_rollout | vs_baseline), NaN where not applicable."""
    rows = []
    for r in summary.get("settings") or []:
        d = r.get(against) or {}
        rows.append({"setting": r["name"], "factor": r["factor"], "side": r.get("side", ""),
                     **{k: d.get(k, math.nan) for k in DISTANCE_NAMES}, "description": r.get("description", "")})
    return pd.DataFrame(rows)
