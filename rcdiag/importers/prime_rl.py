"""Import prime-rl's token exports, `<output_dir>/token_exports/step_<N>/rank_<R>.jsonl` (trainer.enable_token_export).

Three layouts of `src/prime_rl/trainer/rl/token_export.py`, all `schema_version` 1, are read (`LAYOUTS`):
- `weights` (559b447 and since 0be5ac4): per-token `rl_weights` / `ce_weights` / `ref_kl_weights`, a `STABLE`
  marker per step (described below);
- `multi_tenant` (941019f … fa21395, before 289562d removed multi-tenancy): no weight columns but a record-level
  `training_mode` (rl | opd | sft), a per-token `rewards` column, `run_id` and `export_step`, each run writing
  `<output_dir>/<run_id>/token_exports/step_<export_step>/` with its own STABLE markers; a `sft` record's tokens
  are CE on teacher tokens with no sampling log-probs (`_compute_export_tensors` skips them): imported masked;
- `early` (e971d90 … dbe4d1f, `trainer.experimental.token_export`): `training_mode` and `rewards`, one directory,
  and no STABLE marker at all (read with a warning: a step still being written cannot be told apart).

What prime-rl writes (snapshot 559b447): one JSON record per sequence
with `schema_version` (1), `step`, `rank`, `micro_step`, `micro_sequence_idx`, `export_sequence_idx`, `env_name` and
the aligned per-token arrays of `_export_columns` — `token_ids` (prompt + completion), `position_ids`, `loss_mask`,
`advantages`, `inference_logprobs`, `trainer_logprobs`, `entropy`, `mismatch_kl`, `log_importance_ratio`,
`importance_ratio`, `prob_delta`, `is_masked`, `is_masked_high`, `is_masked_low`, `rl_weights`, `ce_weights`,
`ref_kl_weights` — with every non-finite float written as `null` (`_json_float`, `allow_nan=False`). A `STABLE`
marker lands in the step directory once every rank has flushed (`mark_stable`, after a barrier): a step without it
is still being written, or its writer died, and is skipped (named in the warnings).

Positions: value t belongs to token_ids[t] (`train.py` shifts the trainer's log-probs right, position 0 holding
log(1/V)). The response runs from the first loss_mask position to the end of the record (prime-rl trims the
padding); the mask is loss_mask, and — where the record carries rl/ref_kl weights — only tokens with one of them
non-zero (`train.py`'s mismatch_mask: ce-only tokens carry no sampling log-prob).

The trainer side is **π_θ at the micro-step**: prime-rl does not recompute π_old (the ratio is π_θ/μ, and inference
for step n runs on π_{n−1} or older, `docs/algorithms.md`), so this run's gap includes that staleness; the manifest
says so (`measured.trainer`). A `null` on a valid token stays NaN and is reported: the metrics refuse it (a masked
NaN would hide a broken step, trl#6693).
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np

from rcdiag.errors import InputError
from rcdiag.importers.common import Imported, ImportOptions, Record, check_lengths, jsonl_objects
from rcdiag.importers.spans import response_span
from rcdiag.importers.values import number_list, token_id_list, whole_number
from rcdiag.progress import iterate

SCHEMA_VERSION = 1
STEP_DIR = re.compile(r"step_(\d+)$")
ARRAYS = ("loss_mask", "inference_logprobs", "trainer_logprobs", "entropy", "advantages", "rl_weights",
          "ref_kl_weights", "rewards")
NULLABLE = ("inference_logprobs", "trainer_logprobs")
CONVENTIONS = {
    "engine": "prime-rl inference server (vLLM); inference_logprobs as sampled",
    "layout": "token_ids = prompt + completion (one packed sample); every per-token array aligned with them",
    "response": "from the first loss_mask position to the end of the record",
    "mask_field": "loss_mask (and rl_weights or ref_kl_weights non-zero where present: prime-rl's mismatch mask)",
    "rollout_logprobs": "inference_logprobs",
    "train_logprobs": "trainer_logprobs: π_θ at the micro-step (no π_old recompute; async: μ is one or more "
                      "policy versions behind, so the gap includes staleness)",
    "train_entropy": "entropy",
    "null": "prime-rl writes null for a non-finite value: read as NaN and reported, never masked",
    "step": "the record's step (the step_<N> directory)",
}


LAYOUTS = {"weights": "rl/ce/ref_kl weight columns, STABLE markers (prime-rl 559b447)",
           "multi_tenant": "training_mode, rewards, run_id/export_step, per-run directories (941019f)",
           "early": "training_mode, rewards, no STABLE markers (e971d90)"}


def _layout(row: dict[str, Any]) -> str:
    """Which writer wrote a record (LAYOUTS), from the keys it has."""
    if "run_id" in row or "export_step" in row:
        return "multi_tenant"
    return "early" if "training_mode" in row and "rl_weights" not in row else "weights"


def _exports_dir(path: Path) -> Path:
    """The token_exports directory under `path`: its own, else the one run directory of a multi-tenant output
    dir (`<output_dir>/<run_id>/token_exports`); several runs there: InputError naming them (import one each)."""
    if (path / "token_exports").is_dir():
        return path / "token_exports"
    runs = sorted(d for d in path.iterdir() if (d / "token_exports").is_dir())
    if len(runs) == 1:
        return runs[0] / "token_exports"
    if runs:
        raise InputError(f"{len(runs)} runs' token exports here ({', '.join(d.name for d in runs[:6])}): each run "
                         "is its own population; import one, e.g. `rcdiag import prime-rl "
                         f"{runs[0]} -o RUN`", file=str(path))
    return path


def _step_dirs(path: Path) -> list[Path]:
    """The step_<N> directories of a run dir, its token_exports dir, or one step dir, in step order."""
    if not path.is_dir():
        raise InputError("expected prime-rl's output dir, its token_exports/ or a step_<N>/ directory",
                         file=str(path))
    if STEP_DIR.search(path.name):
        return [path]
    base = _exports_dir(path)
    dirs = [d for d in base.iterdir() if d.is_dir() and STEP_DIR.search(d.name)]
    if not dirs:
        raise InputError("no token_exports/step_<N>/ directories here (set trainer.enable_token_export = true)",
                         file=str(path))
    return sorted(dirs, key=lambda d: int(STEP_DIR.search(d.name).group(1)))


def _arrays(row: dict[str, Any], where: tuple[str, int], n: int) -> dict[str, np.ndarray | None]:
    out: dict[str, np.ndarray | None] = {}
    for name in ARRAYS:
        value = row.get(name)
        out[name] = None if value is None else number_list(value, where, name)
        if out[name] is not None and np.isnan(out[name]).all() and name not in NULLABLE:
            out[name] = None  # an optional column exported as all null (the defaults)
        if out[name] is not None and out[name].size != n:
            raise InputError(f"has {out[name].size} values for {n} token_ids", file=where[0], row=where[1],
                             field=name)
    for name in ("loss_mask", "inference_logprobs", "trainer_logprobs"):
        if out[name] is None:
            raise InputError("missing field", file=where[0], row=where[1], field=name)
    return out


def _record(row: dict[str, Any], where: tuple[str, int]) -> Record:
    version = row.get("schema_version")
    if version != SCHEMA_VERSION:
        raise InputError(f"schema_version {version!r}: this importer reads prime-rl's token export schema "
                         f"{SCHEMA_VERSION}", file=where[0], row=where[1], field="schema_version")
    ids = token_id_list(row.get("token_ids"), where, "token_ids")
    arrays = _arrays(row, where, ids.size)
    mask = arrays["loss_mask"] != 0
    weights = [arrays[n] for n in ("rl_weights", "ref_kl_weights") if arrays[n] is not None]
    if weights:
        mask &= np.logical_or.reduce([np.nan_to_num(w) != 0 for w in weights])
    if row.get("training_mode") == "sft":  # CE on teacher tokens: no sampling log-probs (older layouts)
        mask &= False
    span = response_span(ids.size, arrays["loss_mask"], layout="sequence", padded=False)
    rewards = arrays["rewards"]
    reward = None if rewards is None else next((float(v) for v in rewards[arrays["loss_mask"] != 0]
                                                 if np.isfinite(v)), None)
    step = row.get("export_step") if row.get("export_step") is not None else row.get("step")
    return Record(
        where=where, response_ids=ids[span.start:span.end], prompt_ids=ids[span.prompt_start:span.start],
        rollout_logprobs=span.cut(arrays["inference_logprobs"]), train_logprobs=span.cut(arrays["trainer_logprobs"]),
        mask=span.cut(mask.astype(np.float64)), train_entropy=span.cut(arrays["entropy"]),
        token_advantages=span.cut(arrays["advantages"]), step=whole_number(step, where, "step"), reward=reward,
        sample_index=whole_number(row.get("export_sequence_idx"), where, "export_sequence_idx"))


def _nulls(records: list[Record]) -> list[str]:
    """One warning per side naming how many valid tokens prime-rl exported as null (non-finite)."""
    out = []
    for attr, name in (("rollout_logprobs", "inference_logprobs"), ("train_logprobs", "trainer_logprobs")):
        bad = [(r, int(np.sum(np.isnan(getattr(r, attr)) & (np.asarray(r.mask) != 0)))) for r in records]
        bad = [(r, k) for r, k in bad if k]
        if bad:
            first = bad[0][0]
            out.append(f"{sum(k for _, k in bad)} valid token(s) in {len(bad)} record(s) have {name} null (prime-rl "
                       f"writes null for NaN/±inf), first at {first.where[0]} row {first.where[1]}: kept as NaN — "
                       "the metrics refuse them; this is a broken step, not a placeholder")
    return out


def read(path: Path, opts: ImportOptions, fmt: str = "prime-rl") -> Imported:
    """Read prime-rl token exports of every STABLE step into records (see the module docstring)."""
    stable, skipped = [], []
    dirs = _step_dirs(path)
    for step_dir in dirs:
        (stable if (step_dir / "STABLE").is_file() else skipped).append(step_dir)
    early = not stable and _first_layout(dirs) == "early"
    if early:  # the first writer marked nothing: every step is read, and the warning says what that risks
        stable, skipped = dirs, []
    if not stable:
        raise InputError(f"no step directory has its STABLE marker ({len(skipped)} without it): prime-rl writes it "
                         "after every rank flushed; the export is incomplete", file=str(path))
    records: list[Record] = []
    for step_dir in iterate(stable, desc="prime-rl steps", silent=opts.quiet):
        ranks = sorted(step_dir.glob("rank_*.jsonl"), key=lambda f: int(re.sub(r"\D", "", f.stem) or 0))
        for file in ranks:
            records += [_record(row, (str(file), i)) for i, row in jsonl_objects(file)]
    check_lengths(records, {"rollout_logprobs": "inference_logprobs", "train_logprobs": "trainer_logprobs"})
    warnings = _nulls(records)
    if early:
        warnings.append("this export predates prime-rl's STABLE markers (its early token_export.py): every step was "
                        "read, and a step still being written when this ran would be partial")
    sft = sum(1 for r in records if r.mask is not None and len(r.mask) and not np.any(r.mask))
    if sft:
        warnings.append(f"{sft} record(s) with no RL token (training_mode sft, or zero rl/ref_kl weights: CE on "
                        "teacher tokens, no sampling log-probs): imported with every token masked")
    if skipped:
        names = ", ".join(d.name for d in skipped[:4]) + (" …" if len(skipped) > 4 else "")
        warnings.append(f"skipped {len(skipped)} step(s) without a STABLE marker ({names}): still being written, "
                        "or a rank died before flushing")
    layouts = sorted({_layout(row) for row in _peek(stable)})
    lacks = ["sampling settings (temperature, top-p/top-k): in prime-rl's config, not in the export",
             "π_old: trainer_logprobs are π_θ at the micro-step (prime-rl does not recompute old log-probs)"]
    conventions = {**CONVENTIONS, "layout_version": "; ".join(f"{name}: {LAYOUTS[name]}" for name in layouts)}
    return Imported(fmt=fmt, path=path, records=records, conventions=conventions, lacks=lacks,
                    warnings=warnings, sections={"measured": {"trainer": "pi_theta_microstep"}})


def _peek(step_dirs: list[Path]) -> list[dict[str, Any]]:
    """The first record of each step directory's first non-empty rank file (the layout is per writer)."""
    out = []
    for step_dir in step_dirs:
        for file in sorted(step_dir.glob("rank_*.jsonl")):
            first = next(iter(jsonl_objects(file)), None)
            if first is not None:
                out.append(first[1])
                break
    return out


def _first_layout(step_dirs: list[Path]) -> str | None:
    rows = _peek(step_dirs[:1])
    return _layout(rows[0]) if rows else None
