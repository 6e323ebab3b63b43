"""The run-directory contract: column schemas, the typed manifest, `Run`/`open_run` readers, `RunWriter`/`write_run`,
row filters for a pass and the one run-naming rule.
Imports only the ground floor (rcdiag.errors, rcdiag.progress)."""
from rcdiag.lazy import lazy_face

_EXPORTS = {
    **dict.fromkeys(("TOKEN_SCHEMA", "SEQUENCE_SCHEMA"), "rcdiag.store.schema"),
    **dict.fromkeys(("MANIFEST_NAME", "TOKENS_DIR", "SEQUENCES_DIR", "write_json_atomic", "write_parquet_atomic"),
                    "rcdiag.store.files"),
    **dict.fromkeys(("SCHEMA_VERSION", "Manifest", "load_manifest", "new_manifest", "read_manifest", "update_manifest"), "rcdiag.store.manifest"),
    **dict.fromkeys(("Run", "open_run"), "rcdiag.store.run"),
    **dict.fromkeys(("RunWriter", "write_run"), "rcdiag.store.writer"),
    "keep_seq_ids": "rcdiag.store.batches",
    **dict.fromkeys(("safe_name", "unique_run_names"), "rcdiag.store.names"),
}
__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_face(__name__, _EXPORTS)
