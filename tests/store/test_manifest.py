"""The typed manifest: validation at the door, old (first-release) layouts, and the one path/hash form."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import rcdiag
from rcdiag.errors import RunDirError
from rcdiag.importers.common import Imported, Record, write_imported
from rcdiag.notebook import run_html
from rcdiag.store.files import MANIFEST_NAME
from rcdiag.store.manifest import HASH_PREFIX, Manifest, load_manifest, read_manifest, update_manifest
from rcdiag.store.writer import write_run

TOKENS = pd.DataFrame({"seq_id": [0, 0], "pos": [0, 1], "rollout_logprob": [-1.0, -0.5]})

# What `rcdiag score` wrote at the first release (9096209: generate.py + rescore.trainer_settings), trimmed.
FIRST_RELEASE_SCORE = {
    "schema_version": 1, "rcdiag_version": "0.1.0", "created": "2026-11-30T12:00:00Z",
    "source": {"kind": "generated", "retokenized": False},
    "engine": {"name": "vllm", "version": "0.11.0", "model": "/models/tiny", "logprobs_mode": "processed_logprobs",
               "temperature": 0.7, "top_p": 1.0, "top_k": None, "seed": 0},
    "models": {"engine": {"path": "/models/tiny", "hash": "sha256:" + "a" * 64}},
    "trainer": {"model": "models/tiny", "model_hash": "b" * 64, "dtype": "float32", "temperature": 0.7},
    "prompts": {"path": "/data/p.jsonl", "count": 2, "hash": "sha256:" + "c" * 64},
    "warnings": [], "counts": {"sequences": 1, "tokens": 2, "shards": 1},
}
# What an importer wrote (common.source_section) and what the synthetic fixtures/notebook expected (nested sampling).
FIRST_RELEASE_IMPORT = {
    "schema_version": 1, "source": {"kind": "imported:verl", "format": "verl", "path": "dumps/x",
                                    "retokenized": False, "conventions": {"meta_info": {"temperature": 1.0}},
                                    "lacks": ["train_entropy"], "warnings": [], "mask_counts": {}},
    "engine": {"name": "synthetic", "sampling": {"temperature": 0.9, "top_p": 0.95, "top_k": 20},
               "model": {"path": "/models/tiny"}},
}


def _run_with(tmp_path, manifest):
    run = write_run(tmp_path / "r", TOKENS)
    (run.path / MANIFEST_NAME).write_text(json.dumps(manifest))
    return run.path


def test_first_release_score_manifest_reads_with_one_hash_form(tmp_path):
    path = _run_with(tmp_path, FIRST_RELEASE_SCORE)
    typed = load_manifest(path)
    assert typed.trainer.model_hash == HASH_PREFIX + "b" * 64  # bare digest → prefixed
    assert typed.models["engine"].hash == "sha256:" + "a" * 64
    assert typed.engine.temperature == 0.7 and typed.engine_model == "/models/tiny"
    assert read_manifest(path)["prompts"]["hash"] == "sha256:" + "c" * 64  # other sections kept as written


def test_first_release_nested_sampling_reads_flat(tmp_path):
    path = _run_with(tmp_path, FIRST_RELEASE_IMPORT)
    run = rcdiag.open_run(path)
    assert (run.info.engine.temperature, run.info.engine.top_p, run.info.engine.top_k) == (0.9, 0.95, 20)
    assert run.manifest["engine"]["temperature"] == 0.9 and "sampling" not in run.manifest["engine"]
    assert run.info.engine_model == "/models/tiny"
    assert run.manifest["source"]["conventions"] == {"meta_info": {"temperature": 1.0}}  # importer extras kept
    card = run_html(run)
    assert "0.9 / None" in card and "0.95 / 20" in card  # sample temperature, top-p / top-k rows


def test_card_of_a_scored_run_shows_the_sampling_settings(tmp_path):
    """`rcdiag score` writes engine.temperature (flat): the card once read engine.sampling and showed None."""
    card = run_html(rcdiag.open_run(_run_with(tmp_path, FIRST_RELEASE_SCORE)))
    assert "0.7 / 0.7" in card and "1.0 / None" in card and "None / 0.7" not in card


@pytest.mark.parametrize(("content", "field"), [
    ("[1, 2]", "list, not an object"),
    ('"a string"', "str, not an object"),
    ('{"schema_version": 1, "warnings": "oops"}', "'warnings'"),
    ('{"schema_version": 1, "warnings": {"a": 1}}', "'warnings'"),
    ('{"schema_version": "1"}', "'schema_version'"),
    ('{"schema_version": 1, "source": []}', "'source'"),
    ('{"schema_version": 1, "engine": "vllm"}', "'engine'"),
    ('{"schema_version": 1, "engine": {"temperature": "hot"}}', "'engine.temperature'"),
    ('{"schema_version": 1, "engine": {"top_k": true}}', "'engine.top_k'"),
    ('{"schema_version": 1, "counts": {"tokens": "many"}}', "'counts'"),
    ('{"schema_version": 1, "models": {"engine": 3}}', "'models.engine'"),
    ('{"schema_version": 1, "source": {"lacks": [1]}}', "'source.lacks'"),
    ('{"schema_version": 0}', "'schema_version'"),
    ('{"schema_version": 1, "engine": {"enable_prefix_caching": "yes"}}', "'engine.enable_prefix_caching'"),
    ('{"schema_version": 1, "engine": {"seed": 1.5}}', "'engine.seed'"),
    ('{"schema_version": 1, "tokenizer": {"vocab_size": "2048"}}', "'tokenizer.vocab_size'"),
    ('{"schema_version": 1, "checkpoints": {"versions": []}}', "'checkpoints.versions'"),
])
def test_malformed_manifest_is_refused_naming_file_and_field(tmp_path, content, field):
    path = _run_with(tmp_path, {})
    (path / MANIFEST_NAME).write_text(content)
    with pytest.raises(RunDirError, match="manifest") as info:
        rcdiag.open_run(path)
    assert str(path / MANIFEST_NAME) in str(info.value) and field in str(info.value)


def test_missing_schema_version_is_not_an_upgrade_problem(tmp_path):
    path = _run_with(tmp_path, {"source": {"kind": "manual"}})
    with pytest.raises(RunDirError, match="no schema_version: not an rcdiag manifest") as info:
        rcdiag.open_run(path)
    assert "upgrade" not in str(info.value)


def test_writers_normalise_and_unknown_sections_survive(tmp_path):
    run = write_run(tmp_path / "r", TOKENS, manifest={
        "engine": {"sampling": {"temperature": 0.5}}, "custom": {"x": [1, 2]}})
    on_disk = json.loads((run.path / MANIFEST_NAME).read_text())
    assert on_disk["engine"] == {"temperature": 0.5} and on_disk["custom"] == {"x": [1, 2]}
    update_manifest(run.path, {"trainer": {"model_hash": "d" * 64}})
    assert read_manifest(run.path)["trainer"]["model_hash"] == "sha256:" + "d" * 64
    with pytest.raises(RunDirError, match="'warnings'"):
        update_manifest(run.path, {"warnings": "not a list"})
    assert Manifest.from_dict(read_manifest(run.path)).to_dict() == read_manifest(run.path)  # a fixed point


def test_imported_source_path_is_absolute(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "dump.jsonl").write_text("{}")
    record = Record(response_ids=np.array([1, 2]), rollout_logprobs=np.array([-1.0, -2.0]))
    run = write_imported(Imported(fmt="generic", path=Path("dump.jsonl"), records=[record]), "out")
    assert run.manifest["source"]["path"] == str((tmp_path / "dump.jsonl").resolve())
    shutil.rmtree(tmp_path / "out")


def test_readers_get_typed_sections(tmp_path):
    """The fields readers use are typed on run.info (engine settings, tokenizer, checkpoints), survive a
    read-write cycle, and a field a manifest does not record is None (the setting's own default applies)."""
    engine = {"name": "vllm", "engine_dtype": "auto", "dtype_resolved": "bfloat16", "seed": 7,
              "enable_prefix_caching": False, "max_model_len": 1024, "gpu_memory_utilization": 0.5,
              "allow_truncated_sampling": True, "seed_scheme": "kept in extra"}
    sections = {"engine": engine, "tokenizer": {"path": "/t", "vocab_size": 2048, "hash": "vocab-sha256:ab"},
                "checkpoints": {"logprobs": "checkpoints/logprobs.parquet", "versions": {"3": 3}}}
    run = rcdiag.open_run(_run_with(tmp_path, {"schema_version": 1, **sections}))
    got = run.info.engine
    assert (got.requested_dtype, got.dtype_resolved, got.seed, got.enable_prefix_caching, got.max_model_len,
            got.gpu_memory_utilization, got.allow_truncated_sampling) == ("auto", "bfloat16", 7, False, 1024, 0.5,
                                                                          True)
    assert got.extra == {"seed_scheme": "kept in extra"} and got.replayed is None
    assert (run.info.tokenizer.vocab_size, run.info.tokenizer.hash) == (2048, "vocab-sha256:ab")
    assert run.info.checkpoints.versions == {"3": 3} and run.info.checkpoints.attribution is None
    assert {k: run.manifest[k] for k in sections} == {**sections, "engine": engine}  # the dict form as written
    assert Manifest.of(run.info) is run.info and Manifest.of(run.manifest) == run.info
    assert Manifest.of(None).engine is None


def test_replayed_engine_is_typed_and_reads_as_prefill_replay(tmp_path):
    run = rcdiag.open_run(_run_with(tmp_path, {"schema_version": 1, "engine": {"name": "vllm", "replayed": True}}))
    assert run.info.engine.replayed is True and run.info.measured.rollout == "prefill_replay"
