"""Refuse to rescore a run with a training model whose vocabulary differs from the one that generated it.

Compares, whichever are available: the model configs' `vocab_size` (engine vs training model directory), the
tokenizers' vocabularies (a fingerprint: size + sha256 of the sorted token→id map), and the manifest's recorded
`tokenizer.vocab_size` / `tokenizer.hash` (when the hash was made by `tokenizer_fingerprint`).
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from rcdiag.errors import ConfigError
from rcdiag.store.manifest import Manifest
from rcdiag.tokenizers import try_load_tokenizer

HASH_PREFIX = "vocab-sha256:"


def tokenizer_fingerprint(path: str | Path) -> dict[str, Any] | None:
    """{'vocab_size': len(tokenizer), 'base_vocab_size', 'hash': 'vocab-sha256:…', '_vocab'} of a model
    directory's tokenizer (None when it has none). The hash is over the sorted (token, id) list as JSON."""
    tokenizer = try_load_tokenizer(path, warn="skipping the tokenizer comparison")
    if tokenizer is None:
        return None
    vocab = sorted(tokenizer.get_vocab().items(), key=lambda item: (item[1], item[0]))
    digest = hashlib.sha256(json.dumps(vocab, ensure_ascii=False).encode()).hexdigest()
    return {"vocab_size": len(tokenizer), "base_vocab_size": int(tokenizer.vocab_size), "hash": HASH_PREFIX + digest,
            "_vocab": vocab}


def _first_difference(a: list[tuple[str, int]], b: list[tuple[str, int]]) -> str:
    for (tok_a, id_a), (tok_b, id_b) in zip(a, b, strict=False):
        if (tok_a, id_a) != (tok_b, id_b):
            return f"id {id_a}: {tok_a!r} vs id {id_b}: {tok_b!r}"
    return f"{len(a)} vs {len(b)} entries"


def _compare_dirs(engine_path: Path, train_path: Path, train_config: Any) -> dict[str, Any] | None:
    from rcdiag.score.scoring import load_config, model_limits

    if (engine_path / "config.json").is_file():
        engine_vocab, _ = model_limits(load_config(engine_path))
        train_vocab, _ = model_limits(train_config)
        if engine_vocab != train_vocab:
            raise ConfigError(f"--train-model {train_path} has vocab_size {train_vocab} but the run's engine model "
                              f"{engine_path} has {engine_vocab}: the token ids would mean different tokens")
    engine_fp, train_fp = tokenizer_fingerprint(engine_path), tokenizer_fingerprint(train_path)
    if engine_fp and train_fp and engine_fp["hash"] != train_fp["hash"]:
        raise ConfigError(f"the tokenizer of --train-model {train_path} differs from the run's ({engine_path}): "
                          f"{_first_difference(engine_fp['_vocab'], train_fp['_vocab'])}")
    return train_fp


def check_vocabulary(manifest: Manifest | dict[str, Any], engine_path: str | None, train_path: str | Path,
                     train_config: Any) -> None:
    """Raise ConfigError when the training model's vocabulary or tokenizer differs from the run's (`manifest`: a
    Run's `info`, or a manifest dict)."""
    train_path = Path(train_path)
    train_fp = None
    if engine_path is not None and Path(engine_path).is_dir() and \
            Path(engine_path).resolve() != train_path.resolve():
        train_fp = _compare_dirs(Path(engine_path), train_path, train_config)
    recorded = Manifest.of(manifest).tokenizer
    if recorded is None or (recorded.vocab_size is None and recorded.hash is None):  # nothing to hold it against
        return
    train_fp = train_fp or tokenizer_fingerprint(train_path)
    if train_fp is None:
        return
    size = recorded.vocab_size
    if size is not None and int(size) not in (train_fp["vocab_size"], train_fp["base_vocab_size"]):
        raise ConfigError(f"the run's tokenizer has {size} tokens (manifest tokenizer.vocab_size) but the "
                          f"tokenizer of {train_path} has {train_fp['vocab_size']}")
    recorded_hash = recorded.hash
    if isinstance(recorded_hash, str) and recorded_hash.startswith(HASH_PREFIX) and \
            recorded_hash != train_fp["hash"]:
        raise ConfigError(f"the tokenizer of {train_path} differs from the run's (manifest tokenizer.hash "
                          f"{recorded_hash[:24]}… vs {train_fp['hash'][:24]}…)")
