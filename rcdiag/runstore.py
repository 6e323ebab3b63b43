"""Deprecated alias of rcdiag.store (the run directory moved there in 0.2): kept so that code written against
the first release (`rcdiag.runstore.write_run`, `open_run`, `Run`) still runs. Use `rcdiag.store` or `rcdiag.*`."""
from __future__ import annotations

import warnings

from rcdiag.store.files import MANIFEST_NAME, write_json_atomic, write_parquet_atomic
from rcdiag.store.manifest import new_manifest, read_manifest, update_manifest
from rcdiag.store.run import Run, open_run
from rcdiag.store.writer import RunWriter, write_run

warnings.warn("rcdiag.runstore is deprecated: use rcdiag.store (or rcdiag.open_run / rcdiag.write_run)",
              DeprecationWarning, stacklevel=2)

__all__ = ["MANIFEST_NAME", "Run", "RunWriter", "new_manifest", "open_run", "read_manifest", "update_manifest",
           "write_json_atomic", "write_parquet_atomic", "write_run"]
