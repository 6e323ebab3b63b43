"""Convert a GGUF checkpoint into the safetensors model directory that vLLM and rcdiag read (once, atomically).

transformers loads a GGUF file (`from_pretrained(dir, gguf_file=…)`, with the `gguf` package) and dequantises it,
but refuses to save the result ("quantized with GGUF, not serializable"). `convert_gguf` rebuilds the same
architecture from the config without its `quantization_config`, copies the dequantised weights in (strictly: every
tensor, no extra), stores them in `dtype` (bf16 by default, as Hugging Face checkpoints ship; the dequantised
values are rounded once), and saves config, generation config, tokenizer and chat template next to them.

The directory is built under a temporary name beside `out` and renamed when complete, with
`rcdiag-conversion.json` recording the source file's sha256, the library versions and the dtype, so a half-written
conversion never looks complete and a second call with the same source returns at once.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from rcdiag.errors import ConfigError

CONVERSION_FILE = "rcdiag-conversion.json"
SAVE_DTYPES = ("bfloat16", "float32")


def file_sha256(path: str | Path) -> str:
    """sha256 of a file's bytes ('sha256:<hex>')."""
    with open(path, "rb") as handle:
        return "sha256:" + hashlib.file_digest(handle, "sha256").hexdigest()


def conversion_record(out: str | Path) -> dict[str, Any] | None:
    """The recorded conversion of a directory (see the module doc), or None when it holds none."""
    try:
        data = json.loads((Path(out) / CONVERSION_FILE).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def convert_gguf(gguf_file: str | Path, out: str | Path, *, dtype: str = "bfloat16",
                 extra_files: dict[str, str] | None = None, say: Any = None) -> Path:
    """`out`, a model directory converted from `gguf_file` (reused when it records the same source sha256 and
    dtype). `extra_files` (name → text) are written into it too (a model card). ConfigError when the `gguf`
    package is missing or the file cannot be read."""
    source, out = Path(gguf_file), Path(out)
    if dtype not in SAVE_DTYPES:
        raise ConfigError(f"dtype {dtype!r}: choose one of {', '.join(SAVE_DTYPES)}")
    if not source.is_file():
        raise ConfigError(f"{source}: no such GGUF file")
    digest = file_sha256(source)
    record = conversion_record(out)
    if record and record.get("source_sha256") == digest and record.get("dtype") == dtype:
        return out
    if out.exists():
        raise ConfigError(f"{out} exists but is not a conversion of {source.name} in {dtype}; remove it first")
    if say:
        say(f"converting {source.name} → {out} ({dtype} safetensors; once)")
    out.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        versions = _save_dequantised(source, work, dtype)
        for name, text in (extra_files or {}).items():
            (work / name).write_text(text)
        (work / CONVERSION_FILE).write_text(json.dumps(
            {"source": str(source), "source_sha256": digest, "dtype": dtype, **versions}, indent=1) + "\n")
        os.replace(work, out)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    return out


def _save_dequantised(source: Path, work: Path, dtype: str) -> dict[str, str]:
    """Load `source` through transformers' GGUF path and save it as safetensors in `work`; the versions used."""
    import torch
    import transformers
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    try:
        import gguf
    except ImportError:
        raise ConfigError("converting a GGUF file needs the `gguf` package: pip install gguf accelerate") from None
    where, name = str(source.parent), source.name
    try:
        tokenizer = AutoTokenizer.from_pretrained(where, gguf_file=name)
        loaded = AutoModelForCausalLM.from_pretrained(where, gguf_file=name, dtype=torch.float32)
    except (OSError, ValueError, KeyError) as exc:
        raise ConfigError(f"{source}: transformers cannot load this GGUF file ({exc})") from None
    settings = loaded.config.to_dict()
    settings.pop("quantization_config", None)
    settings["dtype"] = dtype
    config = AutoConfig.for_model(settings.pop("model_type"), **settings)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(loaded.state_dict(), strict=True)
    model.generation_config = loaded.generation_config
    del loaded
    model.to(getattr(torch, dtype)).save_pretrained(work)
    tokenizer.save_pretrained(work)
    return {"transformers": transformers.__version__, "gguf": getattr(gguf, "__version__", "?"),
            "torch": torch.__version__}
