"""Which torch device the trainer side runs on: `auto` resolved (cuda when available), and a device that does
not exist refused — before any engine starts, so a bad `--device cuda` fails in a second, not after generation."""
from __future__ import annotations

from typing import Any

from rcdiag.errors import ConfigError
from rcdiag.score.config import TRAIN_DTYPES, check_device_name


def torch_dtype(name: str) -> Any:
    """The torch dtype of a TRAIN_DTYPES name (the trainer's precision, and its routers' in the probe); ConfigError
    for any other. Here, beside the device, so score.scoring and score.routes share it without importing each
    other; torch is imported on the call, not at CLI start."""
    import torch

    if name not in TRAIN_DTYPES:
        raise ConfigError(f"unknown dtype {name!r}; choose one of {', '.join(TRAIN_DTYPES)}")
    return getattr(torch, name)


def resolve_device(device: str = "auto", option: str = "--device") -> str:
    """'cpu', 'cuda' or 'cuda:N' for `device` (DEVICE_HELP); `auto` → 'cuda' when torch sees a CUDA device, else
    'cpu'. ConfigError when CUDA is asked for and absent, or the index is out of range. Idempotent."""
    import torch

    name = check_device_name(device, option)
    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if name.startswith("cuda"):
        if not torch.cuda.is_available():
            raise ConfigError(f"{option} {device!r}: CUDA is not available on this machine (torch "
                              f"{torch.__version__}); use {option} cpu, or auto")
        index = int(name.partition(":")[2] or 0)
        if index >= torch.cuda.device_count():
            raise ConfigError(f"{option} {device!r}: this machine has {torch.cuda.device_count()} CUDA device(s) "
                              f"(cuda:0 … cuda:{torch.cuda.device_count() - 1})")
    return name
