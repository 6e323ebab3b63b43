"""Run directories on any pyarrow filesystem (a local path, `file://…`, `s3://…`, `gs://…`) for `score --ray`.

Same layout and commit rule as rcdiag.store.run: every file is written under a temporary name and moved into
place, a shard's sequences file after its tokens file, the manifest last. Local paths go through
runstore.RunWriter itself; URIs through `UriRunWriter`, which mirrors its resume contract (a spec recorded in
pending.json, complete shards kept, other settings refused unless overwrite).
"""
from __future__ import annotations

import json
import posixpath
from typing import Any
from urllib.parse import urlparse

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from rcdiag.errors import RunDirError
from rcdiag.store.files import MANIFEST_NAME, PENDING_NAME, SEQUENCES_DIR, TOKENS_DIR, shard_name
from rcdiag.store.manifest import normalise
from rcdiag.store.writer import RunWriter


def is_uri(out: str) -> bool:
    """True for `scheme://…` (not a Windows drive letter)."""
    return len(urlparse(str(out)).scheme) > 1


def filesystem(out: str) -> tuple[pafs.FileSystem, str]:
    """(pyarrow filesystem, base path in it) of a local path or URI; RunDirError when pyarrow cannot open it."""
    try:
        return pafs.FileSystem.from_uri(str(out)) if is_uri(out) else (pafs.LocalFileSystem(), str(out))
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, OSError) as exc:
        raise RunDirError(f"{out}: not a filesystem pyarrow can open ({exc}); use a local path or e.g. "
                          "file:///abs/path, s3://bucket/run") from None


class ShardSink:
    """Writes shards into a run directory from any worker (picklable: holds only the URI)."""

    def __init__(self, out: str):
        self.out = str(out)

    def write(self, index: int, tokens: pa.Table, sequences: pa.Table) -> None:
        fs, base = filesystem(self.out)
        for sub, table in ((TOKENS_DIR, tokens), (SEQUENCES_DIR, sequences)):
            _write_atomic(fs, posixpath.join(base, sub, shard_name(index)), table)


def _write_atomic(fs: pafs.FileSystem, path: str, table: pa.Table) -> None:
    directory, name = posixpath.split(path)
    tmp = posixpath.join(directory, f".{name}.tmp")
    fs.create_dir(directory, recursive=True)
    pq.write_table(table, tmp, filesystem=fs, compression="zstd")
    fs.move(tmp, path)


def _write_json(fs: pafs.FileSystem, path: str, obj: Any) -> None:
    directory, name = posixpath.split(path)
    tmp = posixpath.join(directory, f".{name}.tmp")
    with fs.open_output_stream(tmp) as stream:
        stream.write((json.dumps(obj, indent=2, default=str) + "\n").encode())
    fs.move(tmp, path)


def _read_json(fs: pafs.FileSystem, path: str) -> Any:
    if fs.get_file_info(path).type != pafs.FileType.File:
        return None
    with fs.open_input_stream(path) as stream:
        try:
            return json.loads(stream.read())
        except json.JSONDecodeError:
            return {}


class UriRunWriter:
    """RunWriter's contract (complete_shards, finish) on a pyarrow filesystem URI."""

    def __init__(self, out: str, spec: dict[str, Any], *, overwrite: bool = False):
        self.path = str(out)
        self.fs, self.base = filesystem(out)
        self.spec = json.loads(json.dumps(spec, default=str))
        if overwrite:
            for sub in (TOKENS_DIR, SEQUENCES_DIR):
                if self.fs.get_file_info(self._join(sub)).type == pafs.FileType.Directory:
                    self.fs.delete_dir(self._join(sub))
            for name in (MANIFEST_NAME, PENDING_NAME):
                if self.fs.get_file_info(self._join(name)).type == pafs.FileType.File:
                    self.fs.delete_file(self._join(name))
        previous = next((d for d in (_read_json(self.fs, self._join(n)) for n in (PENDING_NAME, MANIFEST_NAME))
                         if d is not None), None)
        if previous is not None and previous.get("spec") != self.spec:
            raise RunDirError(f"{out}: already holds a run made with different settings; pass --overwrite to "
                              "replace it, or choose another --out")
        if previous is None and self._files(SEQUENCES_DIR):
            raise RunDirError(f"{out}: holds shards of an unknown run; pass --overwrite to replace it")
        if _read_json(self.fs, self._join(MANIFEST_NAME)) is None:
            self.fs.create_dir(self.base, recursive=True)
            _write_json(self.fs, self._join(PENDING_NAME), {"spec": self.spec})

    def _join(self, *parts: str) -> str:
        return posixpath.join(self.base, *parts)

    def _files(self, sub: str) -> list[str]:
        selector = pafs.FileSelector(self._join(sub), allow_not_found=True)
        return sorted(i.path for i in self.fs.get_file_info(selector)
                      if posixpath.basename(i.path).startswith("part-") and i.path.endswith(".parquet"))

    def complete_shards(self) -> list[int]:
        return sorted(int(posixpath.basename(p).split("-")[1].split(".")[0]) for p in self._files(SEQUENCES_DIR))

    def finish(self, manifest: dict[str, Any]) -> dict[str, Any]:
        def rows(sub: str) -> int:
            return sum(pq.ParquetFile(p, filesystem=self.fs).metadata.num_rows for p in self._files(sub))

        manifest = {**manifest, "spec": self.spec}
        manifest["counts"] = {**manifest.get("counts", {}), "sequences": rows(SEQUENCES_DIR),
                              "tokens": rows(TOKENS_DIR), "shards": len(self._files(SEQUENCES_DIR))}
        manifest = normalise(manifest, f"{self._join(MANIFEST_NAME)} (being written)")
        _write_json(self.fs, self._join(MANIFEST_NAME), manifest)
        if self.fs.get_file_info(self._join(PENDING_NAME)).type == pafs.FileType.File:
            self.fs.delete_file(self._join(PENDING_NAME))
        return manifest


def open_writer(out: str, spec: dict[str, Any], *, overwrite: bool = False) -> RunWriter | UriRunWriter:
    """RunWriter for a local path, UriRunWriter for a URI (`file://` included, through pyarrow)."""
    return UriRunWriter(out, spec, overwrite=overwrite) if is_uri(out) else RunWriter(out, spec, overwrite=overwrite)


def normalize_out(text: str) -> str:
    """Undo what a Path option does to a URI ("s3://b/run" → "s3:/b/run", "file:///tmp/r" → "file:/tmp/r")."""
    scheme, sep, rest = text.partition(":/")
    if not sep or len(scheme) < 2 or not scheme.isalnum() or rest.startswith("/"):
        return text
    return f"{scheme}:///{rest}" if scheme == "file" else f"{scheme}://{rest}"
