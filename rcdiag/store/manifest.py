"""The manifest of a run directory: create, read (with the version check) and update it atomically."""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from rcdiag import __version__
from rcdiag.errors import RunDirError
from rcdiag.store.files import MANIFEST_NAME, now, write_json_atomic

SCHEMA_VERSION = 1


def rcdiag_version() -> str:
    return __version__


def new_manifest(source: str = "manual", **sections: Any) -> dict[str, Any]:
    """A manifest skeleton: schema/rcdiag versions, creation time, source, then the given sections."""
    manifest: dict[str, Any] = {
        "schema_version": SCHEMA_VERSION,
        "rcdiag_version": rcdiag_version(),
        "created": now(),
        "source": {"kind": source, "retokenized": False},
    }
    manifest.update(sections)
    return manifest


def read_manifest(path: str | os.PathLike) -> dict[str, Any]:
    file = Path(path) / MANIFEST_NAME
    try:
        manifest = json.loads(file.read_text())
    except FileNotFoundError:
        raise RunDirError(f"{path}: not a complete run directory (no {MANIFEST_NAME}); an interrupted "
                          "`rcdiag score` resumes when re-run with the same command") from None
    except json.JSONDecodeError as exc:
        raise RunDirError(f"{file}: manifest is not valid JSON ({exc})") from None
    version = manifest.get("schema_version")
    if not isinstance(version, int) or version > SCHEMA_VERSION:
        raise RunDirError(f"{file}: schema_version {version!r} is not supported by rcdiag {rcdiag_version()} "
                          f"(supports ≤ {SCHEMA_VERSION}); upgrade rcdiag")
    return manifest


def update_manifest(path: str | os.PathLike, updates: dict[str, Any]) -> dict[str, Any]:
    """Merge `updates` (one level deep for dict sections) into a run's manifest and write it atomically."""
    manifest = read_manifest(path)
    for key, value in updates.items():
        if isinstance(value, dict) and isinstance(manifest.get(key), dict):
            manifest[key] = {**manifest[key], **value}
        else:
            manifest[key] = value
    write_json_atomic(Path(path) / MANIFEST_NAME, manifest)
    return manifest

