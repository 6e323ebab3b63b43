"""One flat row per sample (the generic JSONL/Parquet shape): which field holds what, and the row as a Record.

The fields come from the flags (`--response-ids-field` …, `--step-field`), else from the framework profile the
first row matches (rcdiag.importers.profiles: TRL, ms-swift, TRL async, OpenRLHF, verl, AReaL, common names). A
dump in which no log-prob field is found is refused, listing the list-valued fields the row holds and the flags that
name them: importing it would give a run whose both sides are null, which the report could only blame on
placeholders.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from rcdiag.errors import InputError
from rcdiag.importers.common import ImportOptions, Record, length_pattern
from rcdiag.importers.profiles import Profile, detect
from rcdiag.importers.spans import response_span
from rcdiag.importers.values import number, number_list, token_id_list, whole_number

FLAGS = {"response_ids": "response_ids_field", "rollout_logprobs": "rollout_logprobs_field",
         "train_logprobs": "train_logprobs_field", "mask": "mask_field", "prompt_ids": "prompt_ids_field",
         "step": "step_field"}
"""Record attribute → the ImportOptions attribute of the flag that names its field."""
PER_TOKEN = {"rollout_logprobs": "rollout logprobs", "train_logprobs": "train logprobs", "mask": "mask",
             "token_advantages": "per-token advantages", "token_versions": "per-token versions"}
TEXT = {"prompt_text": ("prompt", "prompt_text", "input"), "response_text": ("response", "completion",
        "response_text", "output", "text"), "prompt_id": ("prompt_id", "uid", "group_id", "group_index"),
        "finish_reason": ("finish_reason",)}
NUMBERS = {"reward": ("reward", "score", "rewards")}
WHOLE = {"sample_index": ("sample_index", "index")}


def flag(attr: str) -> str:
    """The command-line spelling of the flag that names `attr`'s field (`--rollout-logprobs-field`)."""
    return "--" + FLAGS[attr].replace("_", "-")


@dataclass
class Fields:
    """The fields one flat dump is read from: the profile, then each attribute's field (None = absent)."""

    profile: Profile
    names: dict[str, str | None] = field(default_factory=dict)
    mask_extra: tuple[str, ...] = ()
    prompt_mask: str | None = None
    attention_mask: str | None = None


def _pick(row: dict[str, Any], names: tuple[str, ...]) -> str | None:
    return next((n for n in names if n in row), None)


def _list_fields(row: dict[str, Any]) -> list[str]:
    return [k for k, v in row.items() if k != "__file__" and isinstance(v, list | tuple | np.ndarray)]


def resolve_fields(first: dict[str, Any], opts: ImportOptions) -> Fields:
    """Record attribute → source field: a flag's value (which must exist), else the profile's first name present.

    Raises InputError when no token-id field is found, or when no log-prob field is (unless `opts.ids_only`)."""
    profile = detect(first)
    candidates = {"response_ids": profile.ids, "rollout_logprobs": profile.rollout, "train_logprobs": profile.train,
                  "mask": profile.mask, "prompt_ids": profile.prompt_ids, "step": profile.step}
    names: dict[str, str | None] = {}
    for attr, options in candidates.items():
        given = getattr(opts, FLAGS[attr])
        if given is not None and given not in first:
            have = ", ".join(k for k in first if k != "__file__")
            raise InputError(f"{flag(attr)} {given}: no such field (have: {have})", file=first["__file__"], row=1,
                             field=given)
        names[attr] = given or _pick(first, options)
    if names["response_ids"] is None:
        raise InputError(f"no token-id field found (tried {', '.join(profile.ids)})", file=first["__file__"], row=1,
                         hint=f"name it with {flag('response_ids')}")
    if names["rollout_logprobs"] is None and names["train_logprobs"] is None and not opts.ids_only:
        lists = [k for k in _list_fields(first) if k not in (names["response_ids"], names["mask"],
                                                             names["prompt_ids"])]
        raise InputError(
            f"no log-prob field found (tried {', '.join(profile.rollout + profile.train) or 'none'}); the row's "
            f"list-valued fields are: {', '.join(lists) or 'none besides the ids'}", file=first["__file__"], row=1,
            hint=f"name them with {flag('rollout_logprobs')} NAME and/or {flag('train_logprobs')} NAME, or pass "
                 "--ids-only to import the token ids alone (then `rcdiag score --rescore-both RUN`)")
    return Fields(profile=profile, names=names, mask_extra=tuple(n for n in profile.mask_extra if n in first),
                  prompt_mask=_pick(first, profile.prompt_mask), attention_mask=_pick(first, profile.attention_mask))


def _get(row: dict[str, Any], name: str | None, where: tuple[str, int]) -> Any:
    if name is None:
        return None
    if name not in row or row[name] is None:
        raise InputError("missing field", file=where[0], row=where[1], field=name)
    return row[name]


def _numbers(row: dict[str, Any], name: str | None, where: tuple[str, int]) -> np.ndarray | None:
    value = _get(row, name, where)
    return None if value is None else number_list(value, where, name)


def _mask(row: dict[str, Any], fields: Fields, where: tuple[str, int]) -> np.ndarray | None:
    """The loss mask, times each extra mask the profile multiplies in (TRL's tool_mask)."""
    mask = _numbers(row, fields.names["mask"], where)
    for name in fields.mask_extra:
        extra = _numbers(row, name, where)
        if mask is not None and extra is not None and extra.size == mask.size:
            mask = mask * extra
    return mask


def _check_aligned(values: dict[str, np.ndarray | None], n: int, row: dict[str, Any], fields: Fields,
                   where: tuple[str, int]) -> None:
    """Sequence layout: every per-token array has one value per position its mask covers."""
    profile = fields.profile
    names = {**fields.names, "token_advantages": _pick(row, profile.advantage),
             "token_versions": _pick(row, profile.token_versions)}
    for attr, array in values.items():
        if array is not None and array.size != n:
            raise InputError(f"has {array.size} values for {n} positions of {fields.names['mask']} "
                             f"({length_pattern(n, array.size)})", file=where[0], row=where[1], field=names[attr])


def _extras(row: dict[str, Any], fields: Fields, where: tuple[str, int]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for attr, names in TEXT.items():
        name = _pick(row, names)
        value = None if name is None else row[name]
        out[attr] = value if value is None or isinstance(value, str) else json.dumps(value, default=str)
    for attr, names in NUMBERS.items():
        name = _pick(row, names)
        out[attr] = None if name is None else number(row[name], where, name)
    for attr, names in WHOLE.items():
        name = _pick(row, names)
        out[attr] = None if name is None else whole_number(row[name], where, name)
    step = fields.names["step"] or _pick(row, fields.profile.step)
    out["step"] = None if step is None else whole_number(row.get(step), where, step)
    profile = fields.profile
    for attr, names in (("policy_version", profile.version), ("policy_version_min", profile.version_min),
                        ("trainer_version", profile.trainer_version)):
        name = _pick(row, names)
        out[attr] = None if name is None else whole_number(row[name], where, name)
    if out["trainer_version"] is None and profile.trainer_from_step is not None and out["step"] is not None \
            and out["policy_version"] is not None:
        out["trainer_version"] = out["step"] + profile.trainer_from_step
    return out


def _per_token(row: dict[str, Any], names: tuple[str, ...], where: tuple[str, int]) -> tuple[Any, Any]:
    """(scalar, per-token array) of a field that is a number per sample or a list per token (advantages)."""
    name = _pick(row, names)
    if name is None or row[name] is None:
        return None, None
    value = row[name]
    if isinstance(value, list | tuple | np.ndarray):
        return None, number_list(value, where, name)
    return number(value, where, name), None


def flat_record(row: dict[str, Any], i: int, fields: Fields) -> Record:
    """One flat row as a Record: the response cut out of a padded or prompt + response layout (spans)."""
    where = (row["__file__"], i)
    names, profile = fields.names, fields.profile
    ids = token_id_list(_get(row, names["response_ids"], where), where, names["response_ids"])
    mask = _mask(row, fields, where)
    advantage, token_advantages = _per_token(row, profile.advantage, where)
    values = {attr: _numbers(row, names[attr], where) for attr in ("rollout_logprobs", "train_logprobs")}
    values["token_advantages"] = token_advantages
    values["token_versions"] = _per_token(row, profile.token_versions, where)[1]
    attention = _numbers(row, fields.attention_mask, where)
    prompt_raw = _get(row, names["prompt_ids"], where)
    prompt = None if prompt_raw is None else token_id_list(prompt_raw, where, names["prompt_ids"])
    if profile.layout == "sequence":
        n_values = ids.size if mask is None else mask.size
        _check_aligned({**values, "mask": mask}, n_values, row, fields, where)
        valid = None if attention is None or attention.size != ids.size else attention
        span = response_span(ids.size, mask, layout="sequence", padded=profile.padded, n_values=n_values,
                             valid=valid)
        prompt = ids[span.prompt_start:span.start]
        cut = span.cut
    else:
        lengths_ok = all(v is None or v.size == ids.size for v in (*values.values(), mask))
        valid = None
        if attention is not None and prompt is not None and attention.size == prompt.size + ids.size:
            valid, prompt = attention[prompt.size:], prompt[attention[:prompt.size] != 0]
        span = response_span(ids.size, mask if lengths_ok else None, layout="response",
                             padded=profile.padded and lengths_ok, valid=valid if lengths_ok else None)
        if prompt is not None and fields.prompt_mask is not None:
            prompt_mask = _numbers(row, fields.prompt_mask, where)
            if prompt_mask is not None and prompt_mask.size == prompt.size:
                prompt = prompt[prompt_mask != 0]
        cut = span.cut if lengths_ok else (lambda v: v)  # a length mismatch is left whole for check_lengths
    return Record(where=where, response_ids=ids[span.start:span.end], prompt_ids=prompt, mask=cut(mask),
                  advantage=advantage, **{attr: cut(v) for attr, v in values.items()}, **_extras(row, fields, where))


def conventions(fields: Fields) -> dict[str, Any]:
    """What the manifest says about a flat dump: the profile (with its source) and every field used."""
    out: dict[str, Any] = {"row_shape": "flat (one row per sequence)", "key_names": fields.profile.name,
                           "key_source": fields.profile.source}
    out.update({f"{attr}_field": name or "absent" for attr, name in fields.names.items()})
    if fields.mask_extra:
        out["mask_field"] = " × ".join((fields.names["mask"] or "1", *fields.mask_extra))
    if fields.profile.layout == "sequence":
        out["layout"] = ("ids are prompt + response; the per-token arrays cover the tail of the ids; the response "
                         "starts at the first mask-1 position")
    if fields.profile.padded:
        out["padding"] = ("batch rows: right padding trimmed (by the attention mask, else after the last mask-1 "
                          "position); prompt left padding dropped by the prompt / attention mask")
    return out
