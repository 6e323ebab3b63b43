"""MoE routes in foreign dumps: the parsing the slime/miles, verl and SGLang importers share.

Every framework stores one row of top-k expert ids per position of the sequence, for every MoE layer, `[rows, L,
k]`, in the positions of its engine's forward: the position that predicts token j+1 holds row j. rcdiag keeps, for
response token t, the row of absolute position P−1+t (P prompt tokens) — rcdiag.store.routes's layout — and the
prompt positions 0 … P−2 as the engine's prompt routes (what R3 replays besides the tokens' own):

- slime / miles `Sample.rollout_routed_experts`: `[len(tokens) − 1, L, k]` int32 (slime/rollout/sglang_rollout.py
  reshapes SGLang's buffer to `(len(sample.tokens) − 1, args.num_layers, args.moe_router_topk)`);
- verl `routed_experts`: `[B, P_pad + R_pad, L, k]` int16/int32, the engine's rows placed from the left-padded prompt's
  first token (verl/experimental/agent_loop/agent_loop.py: `start_pos = P_pad − len(prompt_ids)`), zeros elsewhere;
- SGLang `meta_info.routed_experts`: base64 of int32 `[seqlen − 1 − routed_experts_start_len, L, k]` covering
  positions `[routed_experts_start_len, seqlen − 1)` (SGLang's GenerateReqInput docstring), with
  `meta_info.prompt_tokens` = P.

The route count must equal the token count: a dump whose rows do not cover every response token is refused with
the file, row and field (InputError), as is an id below 0 that is not a whole missing row, and, in a zero-padded
layout, a token whose row is padding (k equal ids). A row of −1 (NeMo-RL's and miles's missing-route sentinel) is
kept as a null route: the token has no route.
"""
from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from rcdiag.errors import InputError, RcdiagError
from rcdiag.store.files import MAX_MANIFEST_BYTES
from rcdiag.store.routes import (
    EXPERT_KEYS,
    PROMPT_ROUTES,
    ROUTE_COLUMN,
    ROUTE_TYPE,
    ROUTING_SECTION,
    TOP_K_KEY,
    RoutingInfo,
    check_ids,
    prompt_column,
)
from rcdiag.store.safefile import read_json

MISSING = -1
"""The id of a route that was not captured (a whole row of it)."""


def route_tensor(value: Any, where: tuple[str, int | None], field_name: str, ndim: int = 3) -> np.ndarray:
    """A dump's routes (numpy array, torch tensor as the safe loader rebuilds it, or nested lists) as an int64
    array of `ndim` dimensions; InputError naming the place otherwise."""
    if hasattr(value, "detach"):
        value = value.detach().cpu().numpy()
    try:
        array = np.asarray(value)
    except (ValueError, TypeError):
        array = np.asarray([], dtype=object)
    if array.ndim != ndim or not (np.issubdtype(array.dtype, np.integer) or array.size == 0):
        raise InputError(f"expected integer expert ids of shape [{'batch, ' if ndim == 4 else ''}positions, layers, "
                         f"top_k], got {array.dtype} of shape {array.shape}", file=where[0], row=where[1],
                         field=field_name)
    return array.astype(np.int64)


def decode_sglang(payload: Any, layers: int, top_k: int, where: tuple[str, int | None], field_name: str
                  ) -> np.ndarray:
    """SGLang's base64 int32 buffer as `[rows, layers, top_k]`; InputError when it is not base64 or its length is
    not a whole number of rows."""
    if not isinstance(payload, str):
        raise InputError(f"expected a base64 string, got {type(payload).__name__}", file=where[0], row=where[1],
                         field=field_name)
    try:
        raw = base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError):
        raise InputError("not valid base64", file=where[0], row=where[1], field=field_name) from None
    width = 4 * layers * top_k
    if len(raw) % width:
        raise InputError(f"{len(raw)} bytes are not a whole number of rows of {layers} layers × top-{top_k} int32 "
                         "ids: the model's shape does not match the routes", file=where[0], row=where[1],
                         field=field_name, hint="check --tokenizer MODEL_DIR's num_hidden_layers and "
                                                "num_experts_per_tok")
    return np.frombuffer(raw, dtype="<i4").astype(np.int64).reshape(-1, layers, top_k)


def model_shape(model_dir: str | None) -> tuple[int, int, int | None] | None:
    """(layers, top_k, experts) from a model directory's config.json (num_hidden_layers, num_experts_per_tok and
    num_experts / num_local_experts / n_routed_experts; `text_config` for multimodal configs); None without one."""
    if not model_dir:
        return None
    try:  # bounded, never a FIFO (rcdiag.store.safefile): --tokenizer may name anything
        data = read_json(Path(model_dir) / "config.json", "model config", MAX_MANIFEST_BYTES)
    except RcdiagError:
        return None
    inner = data.get("text_config") if isinstance(data, dict) and isinstance(data.get("text_config"), dict) else data
    if not isinstance(inner, dict):
        return None
    layers, top_k = inner.get("num_hidden_layers"), inner.get(TOP_K_KEY)
    experts = next((inner[k] for k in EXPERT_KEYS if isinstance(inner.get(k), int)), None)
    if not (isinstance(layers, int) and isinstance(top_k, int)):
        return None
    return layers, top_k, experts


@dataclass
class RouteCollector:
    """The engine's routes of every imported sequence, in record order, turned into the run's route columns.

    `add(...)` takes one sequence's rows and where its response starts; `columns()` the token and sequence
    columns; `section()` the manifest's routing section. Sequences without routes (`add_none`) get nulls."""

    shape: tuple[int, int] | None = None
    experts: int | None = None
    tokens: list[np.ndarray | int] = field(default_factory=list)
    """Per sequence `[n, L, k]` (MISSING rows: no route), or its token count n when it has no routes."""
    prompts: list[np.ndarray | None] = field(default_factory=list)
    count: int = 0

    def add(self, rows: np.ndarray, *, prompt_len: int, response_len: int, where: tuple[str, int | None],
            field_name: str, first: int = 0, padded: bool = False) -> None:
        """One sequence's route rows, row i being absolute position `first` + i. The rows must cover positions
        P−1 … P+n−2 (the route count must equal the token count); with `padded` (a zero-filled layout) a covered
        token whose row is padding is refused too."""
        rows = np.asarray(rows, dtype=np.int64)
        shape = rows.shape[1:]
        if self.shape is None:
            self.shape = (int(shape[0]), int(shape[1]))
        elif shape != self.shape:
            raise InputError(f"routes of {shape[0]} layers × top-{shape[1]}, but earlier samples have "
                             f"{self.shape[0]} × top-{self.shape[1]}", file=where[0], row=where[1], field=field_name)
        start, end = prompt_len - 1 - first, prompt_len - 1 - first + response_len
        if response_len and (start < 0 or end > rows.shape[0]):
            since = f" from position {first}" if first else ""
            raise InputError(f"{rows.shape[0]} route rows{since} for {prompt_len} prompt + {response_len} response "
                             f"tokens: expected {prompt_len + response_len - 1 - first} (one per position that "
                             "predicts a token): the route count must equal the token count",
                             file=where[0], row=where[1], field=field_name,
                             hint="the routes belong to another sample, or the dump was cut")
        token = rows[start:end] if response_len else rows[:0]
        self._check(token, where, field_name, padded)
        self.tokens.append(token)
        prompt = rows[:max(start, 0)] if first == 0 else None
        if prompt is not None:
            self._check(prompt, where, field_name, padded=False)
            prompt = None if (prompt == MISSING).any() else prompt
        self.prompts.append(prompt)
        self.count += 1

    def add_none(self, response_len: int) -> None:
        """A sequence whose dump has no routes: null routes for its tokens."""
        self.tokens.append(int(response_len))
        self.prompts.append(None)

    def _check(self, rows: np.ndarray, where: tuple[str, int | None], field_name: str, padded: bool) -> None:
        missing = (rows == MISSING).all(axis=2)
        partial = (rows < 0).any(axis=2) & ~missing
        if partial.any():
            t, layer = (int(x[0]) for x in np.nonzero(partial))
            raise InputError(f"expert id {int(rows[t, layer].min())} in layer {layer} of response token {t}: a "
                             "negative id is only a whole missing row (-1 in every slot)", file=where[0],
                             row=where[1], field=field_name)
        if padded and rows.shape[2] > 1:
            pad = (rows == rows[:, :, :1]).all(axis=2) & ~missing
            if pad.any():
                t = int(np.nonzero(pad)[0][0])
                raise InputError(f"response token {t}'s routes are padding ({rows.shape[2]} equal ids): the engine "
                                 "returned fewer route rows than tokens — the route count must equal the token "
                                 "count", file=where[0], row=where[1], field=field_name)

    def info(self) -> RoutingInfo | None:
        if self.shape is None or not self.count:
            return None
        return RoutingInfo(layers=self.shape[0], top_k=self.shape[1], experts=self.experts, engine="imported")

    def columns(self, source: str) -> tuple[dict[str, pa.Array], dict[str, pa.Array]]:
        """({engine_routes: …}, {engine_prompt_routes: …}) in record order (empty without any route)."""
        info = self.info()
        if info is None:
            return {}, {}
        layers, top_k = self.shape
        tokens = [np.full((t, layers, top_k), MISSING, np.int64) if isinstance(t, int) else t for t in self.tokens]
        flat = np.concatenate(tokens).reshape(-1, layers * top_k)
        missing = (flat == MISSING).all(axis=1)
        known = flat[~missing]
        check_ids(known, info, source=source, field=ROUTE_COLUMN["engine"])
        offsets = np.concatenate([[0], np.cumsum(np.where(missing, 0, layers * top_k))]).astype(np.int32)
        routes = pa.ListArray.from_arrays(pa.array(offsets), pa.array(known.reshape(-1).astype(np.int16)),
                                          type=ROUTE_TYPE, mask=pa.array(missing))
        return {ROUTE_COLUMN["engine"]: routes}, {PROMPT_ROUTES: prompt_column(self.prompts, info, source=source)}

    def attach(self, imported: Any, source: str) -> None:
        """Put the columns and the manifest's routing section on an importer's result (rcdiag.importers.common.
        Imported: `token_columns`, `sequence_columns`, `sections`)."""
        tokens, sequences = self.columns(source)
        if not tokens:
            return
        imported.token_columns.update(tokens)
        imported.sequence_columns.update(sequences)
        imported.sections[ROUTING_SECTION] = self.info().to_dict()
        imported.conventions["routes"] = ("the engine's top-k expert ids per MoE layer at the position that "
                                          "predicts each token (imported: engine side only; `rcdiag score "
                                          "--rescore-only RUN` adds the trainer's)")
