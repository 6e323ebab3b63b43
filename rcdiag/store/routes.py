"""Mixture-of-experts routes in the run directory: their layout, the manifest's `routing` section, packing them into
columns, checking them, and reading them back as `[T, L, k]` arrays.

Layout. A MoE model's forward over prompt + response[:-1] (the positions that predict a response token) picks, at
every position and MoE layer, the top-k experts. Token row t of a sequence (response token t) holds the routes of
the position that predicts it — prompt position P−1+t — so a token's routes sit beside the log-prob they produced:

- `engine_routes` / `train_routes` (tokens): list<int16> of L·k expert ids, layer-major (layer 0's k ids first);
- `engine_route_probs` / `train_route_probs` (tokens): list<float32> of L·(k+1) router softmax probabilities, per
  layer the k chosen experts' (in the order of the ids) then the best unchosen one's: the selected-expert mass is
  the sum of the first k, the k/(k+1) logit margin log p_k − log p_(k+1) (softmax keeps logit differences);
- `engine_prompt_routes` (sequences): list<int16> of (P−1)·L·k ids, the prompt positions 0 … P−2 — what a trainer
  replaying the engine's routes (R3) forces besides the tokens' own.

The positions are vLLM's `CompletionOutput.routed_experts` rows ([prompt + response − 1, L, k]), slime's
`rollout_routed_experts` (len(tokens) − 1 rows) and SGLang's (seqlen − 1 rows); the last response token's own
position is never run and has no route. Every column is optional: a dense run has none and opens unchanged.

The manifest's `routing` section says the shape (layers, top_k, experts) and what each side's routes are
(ENGINE_ROUTES, TRAINER_ROUTES). A route list of the wrong length, an id outside [0, experts) or a probability
outside [0, 1] is refused with the file, row and column (InputError).
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from rcdiag.errors import InputError, RunDirError
from rcdiag.store.manifest import Manifest
from rcdiag.store.schema import mask_as_bool

ROUTING_SECTION = "routing"
SIDES = ("engine", "trainer")
ROUTE_COLUMN = {"engine": "engine_routes", "trainer": "train_routes"}
PROB_COLUMN = {"engine": "engine_route_probs", "trainer": "train_route_probs"}
PROMPT_ROUTES = "engine_prompt_routes"
ROUTE_TYPE = pa.list_(pa.int16())
PROB_TYPE = pa.list_(pa.float32())
MAX_EXPERTS = int(np.iinfo(np.int16).max) + 1
EXPERT_KEYS = ("num_experts", "num_local_experts", "n_routed_experts")
"""Model config fields that declare the routed expert count (Qwen2/3-MoE, Mixtral/OLMoE, DeepSeek): read by the
scorer (rcdiag.score.routes) and by the importers (a dump's routes take their shape from the model's config)."""
TOP_K_KEY = "num_experts_per_tok"
"""The model config field of the experts chosen per token (k)."""

ENGINE_ROUTES = {
    "prefill_replay": "the engine's routers re-reading the sampled tokens as one prompt (prefill, read from its "
                      "router layers): decode-time effects on routing (one-token steps, batch composition) are "
                      "not in these routes",
    "sampled": "the routes the engine used while sampling (vLLM enable_return_routed_experts / "
               "CompletionOutput.routed_experts)",
    "imported": "the routes the framework's rollout engine returned while sampling (imported from its dump)",
}
"""What `engine_routes` are (manifest routing.engine)."""
TRAINER_ROUTES = {
    "rescored": "the trainer's own routers in rcdiag's padding-free rescoring forward (transformers)",
    "imported": "the trainer's routes as its dump recorded them",
}
"""What `train_routes` are (manifest routing.trainer)."""


@dataclass(frozen=True)
class RoutingInfo:
    """The manifest's `routing` section: the route shape and what each side's routes are."""

    layers: int
    top_k: int
    experts: int | None = None
    engine: str | None = None
    trainer: str | None = None

    def __post_init__(self) -> None:
        for name in ("layers", "top_k"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"routing.{name} must be a whole number ≥ 1, got {value!r}")
        if self.experts is not None and not (isinstance(self.experts, int) and self.top_k < self.experts
                                             <= MAX_EXPERTS):
            raise ValueError(f"routing.experts must be a whole number in ({self.top_k}, {MAX_EXPERTS}], "
                             f"got {self.experts!r}")
        for name, allowed in (("engine", ENGINE_ROUTES), ("trainer", TRAINER_ROUTES)):
            value = getattr(self, name)
            if value is not None and value not in allowed:
                raise ValueError(f"routing.{name} is {value!r}, expected one of {', '.join(allowed)}")

    @property
    def width(self) -> int:
        """Ids per token row: L·k."""
        return self.layers * self.top_k

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if v is not None}

    def with_side(self, side: str, what: str) -> RoutingInfo:
        """This shape with `side` ('engine' / 'trainer') recorded as `what`."""
        return RoutingInfo(**{**asdict(self), side: what})


def routing_info(manifest: Manifest | dict[str, Any], where: str = "manifest.json") -> RoutingInfo | None:
    """The run's RoutingInfo (`manifest`: a Run's `info`, or a manifest dict), None for a run without routes;
    RunDirError naming the field when malformed. Read here, not at the door: a damaged routing section fails the
    commands that use routes, not every command."""
    raw = (manifest.extra if isinstance(manifest, Manifest) else manifest).get(ROUTING_SECTION)
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise RunDirError(f"{where}: field 'routing' is {type(raw).__name__}, expected an object")
    known = {k: raw.get(k) for k in ("layers", "top_k", "experts", "engine", "trainer")}
    try:
        return RoutingInfo(**known)
    except (TypeError, ValueError) as exc:
        raise RunDirError(f"{where}: {exc}; the manifest is damaged (re-create the run)") from None


def merge_info(old: RoutingInfo | None, new: RoutingInfo, where: str) -> RoutingInfo:
    """`new` over `old` (a second stage adding the other side's routes); the shapes must agree."""
    if old is None:
        return new
    if (old.layers, old.top_k) != (new.layers, new.top_k) or None not in (old.experts, new.experts) and \
            old.experts != new.experts:
        raise InputError(f"routes of shape {new.layers} layers × top-{new.top_k} ({new.experts} experts) do not "
                         f"match the run's {old.layers} × top-{old.top_k} ({old.experts} experts)", file=where,
                         field=ROUTING_SECTION, hint="both sides must come from the same model")
    merged = {**{k: v for k, v in asdict(old).items() if v is not None},
              **{k: v for k, v in asdict(new).items() if v is not None}}
    return RoutingInfo(**merged)


# --------------------------------------------------------------------------------------------------- packing
def route_array(routes: np.ndarray, info: RoutingInfo, *, source: str, field: str) -> pa.Array:
    """`[T, L, k]` integer routes → a list<int16> column of T rows (checked first)."""
    routes = np.asarray(routes)
    if routes.ndim != 3 or routes.shape[1:] != (info.layers, info.top_k):
        raise InputError(f"routes of shape {routes.shape}, expected [tokens, {info.layers}, {info.top_k}]",
                         file=source, field=field)
    check_ids(routes.reshape(routes.shape[0], -1), info, source=source, field=field)
    flat = routes.astype(np.int16).reshape(-1)
    return pa.ListArray.from_arrays(pa.array(np.arange(0, flat.size + 1, info.width, dtype=np.int32)),
                                    pa.array(flat, pa.int16()))


def prob_array(probs: np.ndarray, info: RoutingInfo, *, source: str, field: str) -> pa.Array:
    """`[T, L, k+1]` router probabilities → a list<float32> column of T rows (checked first)."""
    probs = np.asarray(probs, dtype=np.float32)
    if probs.ndim != 3 or probs.shape[1:] != (info.layers, info.top_k + 1):
        raise InputError(f"router probabilities of shape {probs.shape}, expected [tokens, {info.layers}, "
                         f"{info.top_k + 1}]", file=source, field=field)
    flat = probs.reshape(-1)
    bad = np.flatnonzero(~((flat >= 0) & (flat <= 1)))
    if bad.size:
        raise InputError(f"router probability {flat[bad[0]]} is outside [0, 1]", file=source,
                         row=int(bad[0]) // probs[0].size + 1, field=field)
    width = info.layers * (info.top_k + 1)
    return pa.ListArray.from_arrays(pa.array(np.arange(0, flat.size + 1, width, dtype=np.int32)),
                                    pa.array(flat, pa.float32()))


def check_ids(ids: np.ndarray, info: RoutingInfo, *, source: str, field: str, row_offset: int = 0) -> None:
    """Every id of `ids` ([rows, L·k]) in [0, experts) (≥ 0 when experts is unknown): InputError at the first
    bad one, rows counted from 1 after `row_offset`."""
    upper = info.experts if info.experts is not None else MAX_EXPERTS
    bad = (ids < 0) | (ids >= upper)
    if bad.any():
        row, col = (int(x[0]) for x in np.nonzero(bad))
        raise InputError(f"expert id {int(ids[row, col])} (layer {col // info.top_k % info.layers}) is outside [0, {upper})",
                         file=source, row=row_offset + row + 1, field=field,
                         hint="the routes belong to another model, or the dump is damaged")


def check_column(column: pa.ChunkedArray | pa.Array, info: RoutingInfo, name: str, *, source: str,
                 width: int | Sequence[int] | None = None) -> None:
    """A stored route / probability column: every non-null row has its expected length (`width`: one number, or
    one per row; default L·k for ids, L·(k+1) for probabilities), ids in range, probabilities in [0, 1]."""
    column = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    is_prob = pa.types.is_floating(column.type.value_type)
    expected = width if width is not None else info.layers * (info.top_k + 1) if is_prob else info.width
    lengths = np.asarray(pc.fill_null(pc.list_value_length(column), -1), dtype=np.int64)
    want = np.broadcast_to(np.asarray(expected, dtype=np.int64), lengths.shape)
    bad = np.flatnonzero((lengths != want) & (lengths >= 0))
    if bad.size:
        i = int(bad[0])
        per = info.layers * (info.top_k + 1) if is_prob else info.width
        raise InputError(f"{lengths[i]} values where {want[i]} were expected ({want[i] // per} position(s) × "
                         f"{info.layers} layers × {info.top_k + int(is_prob)}): the route count must equal the "
                         "token count", file=source, row=i + 1, field=name)
    values = np.asarray(pc.list_flatten(column))
    if is_prob:
        bad = np.flatnonzero(~((values >= 0) & (values <= 1)))
        if bad.size:
            row = int(np.searchsorted(np.cumsum(np.maximum(lengths, 0)), bad[0], side="right"))
            raise InputError(f"router probability {values[bad[0]]} is outside [0, 1]", file=source, row=row + 1,
                             field=name)
        return
    upper = info.experts if info.experts is not None else MAX_EXPERTS
    bad = np.flatnonzero((values < 0) | (values >= upper))
    if bad.size:
        row = int(np.searchsorted(np.cumsum(np.maximum(lengths, 0)), bad[0], side="right"))
        raise InputError(f"expert id {int(values[bad[0]])} is outside [0, {upper})", file=source, row=row + 1,
                         field=name, hint="the routes belong to another model, or the dump is damaged")


def check_shard(tokens: pa.Table, sequences: pa.Table | None, info: RoutingInfo, *, source: str) -> None:
    """Every route column of one shard (tokens, and the sequences' prompt routes against prompt_len)."""
    for name in (*ROUTE_COLUMN.values(), *PROB_COLUMN.values()):
        if name in tokens.column_names:
            check_column(tokens.column(name), info, name, source=source)
    if sequences is not None and PROMPT_ROUTES in sequences.column_names:
        prompt_len = np.asarray(pc.fill_null(sequences.column("prompt_len"), 1), dtype=np.int64)
        check_column(sequences.column(PROMPT_ROUTES), info, PROMPT_ROUTES, width=np.maximum(prompt_len - 1, 0)
                     * info.width, source=source.replace("tokens", "sequences"))


def with_column(table: pa.Table, name: str, values: pa.Array) -> pa.Table:
    """`table` with column `name` set to `values` (appended when absent, replaced when present)."""
    field = pa.field(name, values.type)
    if name in table.column_names:
        return table.set_column(table.schema.get_field_index(name), field, values)
    return table.append_column(field, values)


# --------------------------------------------------------------------------------------------------- reading
@dataclass(frozen=True)
class RouteRows:
    """Token rows of a run that carry routes on every requested side: keys, |ℓ| where both log-probs are known
    (NaN elsewhere), the valid mask, and per side `[N, L, k]` ids and `[N, L, k+1]` probabilities (None when the
    run has none)."""

    info: RoutingInfo
    seq_id: np.ndarray
    pos: np.ndarray
    abs_ell: np.ndarray
    valid: np.ndarray
    routes: dict[str, np.ndarray]
    probs: dict[str, np.ndarray | None]

    def __len__(self) -> int:
        return int(self.seq_id.size)


def as_3d(column: pa.Array | pa.ChunkedArray, rows: int, layers: int, width: int, dtype: type) -> np.ndarray:
    """A list column of `rows` non-null rows of layers·width values → `[rows, layers, width]`, through Arrow's
    flat values (no per-row Python lists)."""
    values = np.asarray(pc.list_flatten(column), dtype=dtype)
    return values.reshape(rows, layers, width)


def read_routes(path: Path, token_files: Sequence[Path], info: RoutingInfo,
                sides: Sequence[str] = SIDES) -> RouteRows:
    """The token rows with routes on every side of `sides`, from `token_files` (checked as they are read)."""
    keys: dict[str, list[np.ndarray]] = {k: [] for k in ("seq_id", "pos", "abs_ell", "valid")}
    routes: dict[str, list[np.ndarray]] = {s: [] for s in sides}
    probs: dict[str, list[np.ndarray]] = {s: [] for s in sides}
    for file in token_files:
        have = pq.read_schema(file).names
        missing = [ROUTE_COLUMN[s] for s in sides if ROUTE_COLUMN[s] not in have]
        if missing:
            raise RunDirError(f"{file}: no {', '.join(missing)} column although the manifest has a routing "
                              "section; re-create the run")
        wanted = ["seq_id", "pos", "rollout_logprob", "train_logprob", "mask",
                  *[c for s in sides for c in (ROUTE_COLUMN[s], PROB_COLUMN[s]) if c in have]]
        table = pq.read_table(file, columns=wanted)
        source = f"{path}/{file.parent.name}/{file.name}"
        for name in wanted[5:]:
            check_column(table.column(name), info, name, source=source)
        keep = np.ones(table.num_rows, dtype=bool)
        for s in sides:
            keep &= ~np.asarray(table.column(ROUTE_COLUMN[s]).is_null())
        table = table.filter(pa.array(keep))
        n = table.num_rows
        rollout, train = (np.asarray(pc.fill_null(table.column(c).cast(pa.float64()), np.nan), dtype=np.float64)
                          for c in ("rollout_logprob", "train_logprob"))
        keys["seq_id"].append(np.asarray(table.column("seq_id"), dtype=np.int64))
        keys["pos"].append(np.asarray(table.column("pos"), dtype=np.int64))
        keys["abs_ell"].append(np.abs(rollout - train))
        keys["valid"].append(mask_as_bool(table))
        for s in sides:
            routes[s].append(as_3d(table.column(ROUTE_COLUMN[s]).combine_chunks(), n, info.layers, info.top_k,
                                    np.int16))
            name = PROB_COLUMN[s]
            if name in table.column_names and table.column(name).null_count == 0:
                probs[s].append(as_3d(table.column(name).combine_chunks(), n, info.layers, info.top_k + 1,
                                       np.float32))
    cat = {k: np.concatenate(v) if v else np.zeros(0) for k, v in keys.items()}
    return RouteRows(
        info=info, seq_id=cat["seq_id"].astype(np.int64), pos=cat["pos"].astype(np.int64), abs_ell=cat["abs_ell"],
        valid=cat["valid"].astype(bool),
        routes={s: np.concatenate(v) if v else np.zeros((0, info.layers, info.top_k), np.int16)
                for s, v in routes.items()},
        probs={s: np.concatenate(v) if v and len(v) == len(routes[s]) else None for s, v in probs.items()})


def confidence_from_probs(probs: np.ndarray, top_k: int) -> tuple[np.ndarray, np.ndarray]:
    """(selected-expert mass `[N, L]`, k/(k+1) logit margin `[N, L]`) from stored probabilities `[N, L, k+1]`."""
    p = np.asarray(probs, dtype=np.float64)
    mass = p[:, :, :top_k].sum(axis=2)
    with np.errstate(divide="ignore"):
        margin = np.log(p[:, :, :top_k].min(axis=2)) - np.log(p[:, :, top_k])
    return mass, margin


# --------------------------------------------------------------------------------------------------- columns
def token_columns(side: str, routes: Sequence[np.ndarray], info: RoutingInfo, *, source: str,
                  probs: Sequence[np.ndarray] | None = None) -> dict[str, pa.Array]:
    """The token columns of one side from per-sequence `[R, L, k]` routes (and `[R, L, k+1]` probabilities), in
    token-row order."""
    shape = (0, info.layers, info.top_k)
    columns = {ROUTE_COLUMN[side]: route_array(np.concatenate(routes) if routes else np.zeros(shape, np.int16),
                                               info, source=source, field=ROUTE_COLUMN[side])}
    if probs is not None:
        stacked = np.concatenate(probs) if probs else np.zeros((0, info.layers, info.top_k + 1), np.float32)
        columns[PROB_COLUMN[side]] = prob_array(stacked, info, source=source, field=PROB_COLUMN[side])
    return columns


def prompt_column(routes: Sequence[np.ndarray | None], info: RoutingInfo, *, source: str) -> pa.Array:
    """The sequences' `engine_prompt_routes` from per-sequence `[P−1, L, k]` routes (None: unknown → null)."""
    values: list[list[int] | None] = []
    for row, part in enumerate(routes):
        if part is None:
            values.append(None)
            continue
        part = np.asarray(part)
        if part.ndim != 3 or part.shape[1:] != (info.layers, info.top_k):
            raise InputError(f"prompt routes of shape {part.shape}, expected [prompt − 1, {info.layers}, "
                             f"{info.top_k}]", file=source, row=row + 1, field=PROMPT_ROUTES)
        check_ids(part.reshape(1, -1) if part.size else part.reshape(0, 1), info, source=source,
                  field=PROMPT_ROUTES, row_offset=row)
        values.append(part.astype(np.int64).reshape(-1).tolist())
    return pa.array(values, ROUTE_TYPE)
