"""The manifest of a run directory: one typed schema (`Manifest`) that every writer and reader goes through.

Writers (`rcdiag score`, the rescore/replay stages, importers, `--ray`, `write_run`) build a plain dict and the
store normalises it through `Manifest` before writing; readers get `run.manifest` (the normalised dict, for
JSON-minded code and users) or `run.info` (this typed view). Conventions, enforced here:

- paths (model, prompts, tokenizer, imported source) are absolute, resolved by the writer (`abs_path`): a run
  directory is read from other working directories (the dashboard, a notebook), where a relative path means
  nothing. Old manifests with relative paths keep them (the reader cannot know what they were relative to).
- content hashes carry their algorithm: `sha256:<64 hex>`; a bare 64-hex digest (first-release trainer
  `model_hash`) reads as `sha256:<hex>`.
- sampling settings live flat in `engine` (`engine.temperature/top_p/top_k`); the first release's
  `engine.sampling.{temperature,top_p,top_k}` (synthetic fixtures, old notebooks) reads as the flat form.
- context a run carries besides its rows (rcdiag.store.sections): the policy's architecture (`model`), the
  engine's quantization and KV-cache dtype (`engine.quantization`, `engine.kv_cache_dtype`), the trainer's own
  correction settings (`trainer.correction`), and where each stated fact came from (`provenance`). What no
  source said stays absent: never a default dressed as a fact.

A file that is not a JSON object, lacks `schema_version`, or holds a field of the wrong type is refused at the
door with a RunDirError naming the file and the field, never an AttributeError deeper down.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from rcdiag import __version__
from rcdiag.errors import InputError, RunDirError
from rcdiag.store.files import MANIFEST_NAME, MAX_MANIFEST_BYTES, now, write_json_atomic
from rcdiag.store.safefile import read_json
from rcdiag.store.sections import (
    ARCHITECTURES,
    ROLLOUT_MEASURED,
    TRAINER_MEASURED,
    Checkpoints,
    Correction,
    Engine,
    Measured,
    ModelInfo,
    ModelRef,
    Source,
    TokenizerRef,
    Trainer,
)

SCHEMA_VERSION = 1
HASH_PREFIX = "sha256:"
CHECKPOINTS_SECTION = "checkpoints"
"""The manifest section `rcdiag score --checkpoint` writes (files under RUN/checkpoints/, each checkpoint's
version label) and the lag split reads."""
_BARE_SHA256 = re.compile(r"[0-9a-f]{64}")

# field checks by annotation: (accepted types, what the error says). bool is refused where a number is meant.
_CHECKS: dict[str, tuple[tuple[type, ...], str]] = {
    "str | None": ((str,), "a string"),
    "float | None": ((int, float), "a number"),
    "int | None": ((int,), "an integer"),
    "bool": ((bool,), "true or false"),
    "bool | None": ((bool,), "true or false"),
    "list[str]": ((list,), "a list"),
    "dict[str, Any]": ((dict,), "an object"),
    "dict[str, str]": ((dict,), "an object"),
}
NESTED: dict[str, type] = {"Correction | None": Correction}
"""Field annotations that are sections of their own (trainer.correction): read and written recursively."""


def rcdiag_version() -> str:
    return __version__


def abs_path(path: str | os.PathLike | None) -> str | None:
    """The manifest form of a local path: absolute and resolved (see the module docstring); None stays None."""
    return None if path is None else str(Path(path).expanduser().resolve())


def sha256_form(digest: Any) -> Any:
    """A hash in the manifest's one form, `sha256:<hex>`: bare 64-hex digests get the prefix, others unchanged."""
    if isinstance(digest, str) and _BARE_SHA256.fullmatch(digest):
        return HASH_PREFIX + digest
    return digest


def _refuse(where: str, name: str, problem: str) -> RunDirError:
    return RunDirError(f"{where}: field {name!r} {problem}; the manifest is damaged or was not written by rcdiag "
                       "(re-create the run with `rcdiag score` / `rcdiag import`)")


def _section(cls: type, raw: Any, where: str, name: str) -> Any:
    """An instance of the dataclass `cls` from the JSON object `raw`: known fields type-checked, the rest kept
    in `extra` (so sections written by newer code or by a trainer survive a read-write cycle)."""
    if not isinstance(raw, dict):
        raise _refuse(where, name, f"is {type(raw).__name__}, expected an object")
    known = {f.name: f for f in fields(cls) if f.name != "extra"}
    values: dict[str, Any] = {}
    for key, spec in known.items():
        if key not in raw or raw[key] is None:
            continue
        value = raw[key]
        if str(spec.type) in NESTED:
            values[key] = _section(NESTED[str(spec.type)], value, where, f"{name}.{key}")
            continue
        types, says = _CHECKS[str(spec.type)]
        if not isinstance(value, types) or (bool not in types and isinstance(value, bool)):
            raise _refuse(where, f"{name}.{key}", f"is {value!r}, expected {says}")
        if says == "a list" and not all(isinstance(item, str) for item in value):
            raise _refuse(where, f"{name}.{key}", "must be a list of strings")
        values[key] = value
    return cls(**values, extra={k: v for k, v in raw.items() if k not in known})


def _emit(section: Any) -> dict[str, Any]:
    """A section back as a JSON object: known fields that are set, then the extra keys."""
    out = {f.name: getattr(section, f.name) for f in fields(section) if f.name != "extra"}
    out = {k: _emit(v) if isinstance(v, tuple(NESTED.values())) else v for k, v in out.items()}
    return {**{k: v for k, v in out.items() if v is not None}, **section.extra}


_TOP = ("schema_version", "rcdiag_version", "created", "source", "engine", "trainer", "models", "warnings",
        "counts", "measured", "tokenizer", CHECKPOINTS_SECTION, "model", "provenance")


@dataclass
class Manifest:
    """A run's manifest, typed. `extra` keeps every other top-level section (prompts, rewards, spec, distributed,
    routing, …) as written."""
    schema_version: int = SCHEMA_VERSION
    rcdiag_version: str | None = None
    created: str | None = None
    source: Source = field(default_factory=Source)
    engine: Engine | None = None
    trainer: Trainer | None = None
    models: dict[str, ModelRef] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    counts: dict[str, int] = field(default_factory=dict)
    measured: Measured = field(default_factory=Measured)
    tokenizer: TokenizerRef | None = None
    checkpoints: Checkpoints | None = None
    model: ModelInfo | None = None
    """The policy model's architecture (`model`, rcdiag.store.sections.ModelInfo)."""
    provenance: dict[str, str] = field(default_factory=dict)
    """Where each stated context fact came from, by its manifest path ("engine.dtype": "rcdiag score
    --rescore-only --engine-dtype", "trainer.correction": "trl.GRPOConfig (record_grpo)", …): what a user or a
    trainer's config said, as opposed to what rcdiag measured or generated itself."""
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def of(cls, manifest: Manifest | dict[str, Any] | None, where: str = MANIFEST_NAME) -> Manifest:
        """`manifest` typed: a Manifest as it is, a dict validated through `from_dict`, None as an empty one —
        for library functions that take either a Run's `info` or a manifest dict built by hand."""
        if isinstance(manifest, Manifest):
            return manifest
        return cls() if manifest is None else cls.from_dict(manifest, where)

    @classmethod
    def from_dict(cls, raw: Any, where: str = MANIFEST_NAME) -> Manifest:
        """Validate and normalise a manifest object (old layouts included); RunDirError naming `where` and the
        field on anything malformed."""
        if not isinstance(raw, dict):
            kind = "null" if raw is None else type(raw).__name__  # JSON's name for None, not "NoneType"
            raise RunDirError(f"{where}: the manifest is a JSON {kind}, not an object; the file is "
                              "damaged or not an rcdiag manifest")
        version = raw.get("schema_version", SCHEMA_VERSION)
        if not isinstance(version, int) or isinstance(version, bool):
            raise _refuse(where, "schema_version", f"is {version!r}, expected an integer")
        warnings = _or(raw.get("warnings"), [])
        if not isinstance(warnings, list):
            raise _refuse(where, "warnings", f"is {type(warnings).__name__}, expected a list")
        counts = _or(raw.get("counts"), {})
        if not isinstance(counts, dict) or not all(isinstance(v, int) for v in counts.values()):
            raise _refuse(where, "counts", f"is {counts!r}, expected an object of integers")
        models = _or(raw.get("models"), {})
        if not isinstance(models, dict):
            raise _refuse(where, "models", f"is {type(models).__name__}, expected an object")
        engine = raw.get("engine")
        manifest = cls(
            schema_version=version, rcdiag_version=_text(raw, "rcdiag_version", where),
            created=_text(raw, "created", where),
            source=_section(Source, _or(raw.get("source"), {}), where, "source"),
            engine=None if engine is None else _section(Engine, _flat_engine(engine), where, "engine"),
            trainer=None if raw.get("trainer") is None else _trainer(raw["trainer"], where),
            models={role: _model(ref, where, f"models.{role}") for role, ref in models.items()},
            warnings=[str(w) for w in warnings], counts=counts,
            measured=_measured(raw.get("measured"), where),
            tokenizer=None if raw.get("tokenizer") is None else _section(TokenizerRef, raw["tokenizer"], where,
                                                                            "tokenizer"),
            checkpoints=None if raw.get(CHECKPOINTS_SECTION) is None else _section(
                Checkpoints, raw[CHECKPOINTS_SECTION], where, CHECKPOINTS_SECTION),
            model=None if raw.get("model") is None else _model_info(raw["model"], where),
            provenance=_provenance(raw.get("provenance"), where),
            extra={k: v for k, v in raw.items() if k not in _TOP})
        _infer_measured(manifest)
        return manifest

    def to_dict(self) -> dict[str, Any]:
        """The JSON object written to manifest.json (and exposed as `Run.manifest`)."""
        out: dict[str, Any] = {"schema_version": self.schema_version}
        if self.rcdiag_version is not None:
            out["rcdiag_version"] = self.rcdiag_version
        if self.created is not None:
            out["created"] = self.created
        out["source"] = _emit(self.source)
        out.update(self.extra)
        if self.engine is not None:
            out["engine"] = _emit(self.engine)
        if self.trainer is not None:
            out["trainer"] = _emit(self.trainer)
        if self.models:
            out["models"] = {role: _emit(ref) for role, ref in self.models.items()}
        measured = _emit(self.measured)
        if measured:
            out["measured"] = measured
        if self.tokenizer is not None:
            out["tokenizer"] = _emit(self.tokenizer)
        if self.checkpoints is not None:
            out[CHECKPOINTS_SECTION] = _emit(self.checkpoints)
        if self.model is not None:
            out["model"] = _emit(self.model)
        if self.provenance:
            out["provenance"] = dict(self.provenance)
        out["warnings"] = list(self.warnings)
        if self.counts:
            out["counts"] = dict(self.counts)
        return out

    @property
    def engine_model(self) -> str | None:
        """The engine's model path: `engine.model`, else `models.engine.path`."""
        if self.engine is not None and self.engine.model is not None:
            return self.engine.model
        ref = self.models.get("engine")
        return None if ref is None else ref.path


def _or(value: Any, default: Any) -> Any:
    """`default` for an absent (None) value; falsy values of the wrong type stay, to be refused."""
    return default if value is None else value


def _text(raw: dict[str, Any], key: str, where: str) -> str | None:
    value = raw.get(key)
    if value is not None and not isinstance(value, str):
        raise _refuse(where, key, f"is {value!r}, expected a string")
    return value


def _flat_engine(raw: Any) -> Any:
    """The first release's nested `engine.sampling` and `engine.model: {path}` as the flat form."""
    if not isinstance(raw, dict):
        return raw
    flat = dict(raw)
    sampling = flat.pop("sampling", None)
    if isinstance(sampling, dict):
        for key in ("temperature", "top_p", "top_k"):
            if flat.get(key) is None and sampling.get(key) is not None:
                flat[key] = sampling[key]
    elif sampling is not None:
        flat["sampling"] = sampling
    if isinstance(flat.get("model"), dict):
        flat["model"] = flat["model"].get("path")
    return flat


def _measured(raw: Any, where: str) -> Measured:
    measured = _section(Measured, _or(raw, {}), where, "measured")
    for name, allowed in (("rollout", ROLLOUT_MEASURED), ("trainer", TRAINER_MEASURED)):
        value = getattr(measured, name)
        if value is not None and value not in allowed:
            raise _refuse(where, f"measured.{name}", f"is {value!r}, expected one of {', '.join(allowed)}")
    return measured


def _infer_measured(manifest: Manifest) -> None:
    """Fill what `measured` does not say from what the manifest does (see Measured)."""
    measured, engine = manifest.measured, manifest.engine
    if engine is not None and engine.replayed is True:
        measured.rollout = "prefill_replay"
    elif measured.rollout is None and manifest.source.kind == "generated":
        measured.rollout = "sampled"
    if measured.trainer is None and manifest.trainer is not None and manifest.trainer.model is not None:
        measured.trainer = "pi_old"


def _trainer(raw: Any, where: str) -> Trainer:
    trainer = _section(Trainer, raw, where, "trainer")
    trainer.model_hash = sha256_form(trainer.model_hash)
    return trainer


def _model_info(raw: Any, where: str) -> ModelInfo:
    info = _section(ModelInfo, raw, where, "model")
    if info.architecture is not None and info.architecture not in ARCHITECTURES:
        raise _refuse(where, "model.architecture", f"is {info.architecture!r}, expected one of "
                      f"{', '.join(ARCHITECTURES)}")
    return info


def _provenance(raw: Any, where: str) -> dict[str, str]:
    value = _or(raw, {})
    if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
        raise _refuse(where, "provenance", f"is {value!r}, expected an object of strings")
    return {str(k): v for k, v in value.items()}


def _model(raw: Any, where: str, name: str) -> ModelRef:
    if isinstance(raw, str):  # a bare path
        raw = {"path": raw}
    ref = _section(ModelRef, raw, where, name)
    ref.hash = sha256_form(ref.hash)
    return ref


def normalise(manifest: dict[str, Any], where: str = MANIFEST_NAME) -> dict[str, Any]:
    """`manifest` validated and in the one layout (the form every writer writes)."""
    return Manifest.from_dict(manifest, where).to_dict()


def new_manifest(source: str = "manual", **sections: Any) -> dict[str, Any]:
    """A manifest skeleton: schema/rcdiag versions, creation time, source, then the given sections."""
    manifest: dict[str, Any] = {
        "schema_version": SCHEMA_VERSION,
        "rcdiag_version": rcdiag_version(),
        "created": now(),
        "source": {"kind": source, "retokenized": False},
    }
    manifest.update(sections)
    return normalise(manifest, "new manifest")


def write_manifest(path: str | os.PathLike, manifest: dict[str, Any]) -> dict[str, Any]:
    """Normalise `manifest` through the schema and write it to `<path>/manifest.json` atomically; returns it."""
    normal = normalise(manifest, f"{Path(path) / MANIFEST_NAME} (being written)")
    write_json_atomic(Path(path) / MANIFEST_NAME, normal)
    return normal


def load_manifest(path: str | os.PathLike) -> Manifest:
    """The typed manifest of the run directory `path`, checked at the door (see the module docstring)."""
    file = Path(path) / MANIFEST_NAME
    if not os.path.lexists(file):
        raise RunDirError(f"{path}: not a complete run directory (no {MANIFEST_NAME}); an interrupted "
                          "`rcdiag score` resumes when re-run with the same command")
    try:  # a regular file, bounded; JSON's tracebacks (5,000-digit integers, deep nesting, lone surrogates) named
        raw = read_json(file, "manifest", MAX_MANIFEST_BYTES)
    except InputError as exc:
        raise RunDirError(f"{exc} (the manifest is damaged: re-create the run)") from None
    if isinstance(raw, dict) and "schema_version" not in raw:
        raise RunDirError(f"{file}: no schema_version: not an rcdiag manifest, or a damaged one (re-create the "
                          "run with `rcdiag score` / `rcdiag import`)")
    manifest = Manifest.from_dict(raw, str(file))
    if manifest.schema_version < 1:
        raise _refuse(str(file), "schema_version", f"is {manifest.schema_version}, expected ≥ 1")
    if manifest.schema_version > SCHEMA_VERSION:
        raise RunDirError(f"{file}: schema_version {manifest.schema_version!r} is not supported by rcdiag "
                          f"{rcdiag_version()} (supports ≤ {SCHEMA_VERSION}); upgrade rcdiag")
    return manifest


def read_manifest(path: str | os.PathLike) -> dict[str, Any]:
    """The manifest of the run directory `path` as a normalised dict (`load_manifest(path).to_dict()`)."""
    return load_manifest(path).to_dict()


def update_manifest(path: str | os.PathLike, updates: dict[str, Any]) -> dict[str, Any]:
    """Merge `updates` (one level deep for dict sections) into a run's manifest and write it atomically."""
    manifest = read_manifest(path)
    for key, value in updates.items():
        if isinstance(value, dict) and isinstance(manifest.get(key), dict):
            manifest[key] = {**manifest[key], **value}
        else:
            manifest[key] = value
    return write_manifest(path, manifest)
