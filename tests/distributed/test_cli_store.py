"""Cheap checks of `--ray` that start no engine: option errors, the missing-Ray hint, URI handling and the URI
run writer's resume contract (spec refusal, complete shards, manifest last)."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pyarrow as pa
import pytest

from rcdiag.cli import main
from rcdiag.distributed.store import ShardSink, UriRunWriter, is_uri, normalize_out, open_writer
from rcdiag.errors import RunDirError
from rcdiag.store.run import open_run
from rcdiag.store.writer import RunWriter

PROMPTS = Path(__file__).resolve().parents[2] / "sample_data" / "prompts.jsonl"


def _score(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    code = main(["score", *args])
    captured = capsys.readouterr()
    return code, captured.out + captured.err


def test_score_ray_refuses_generate_only(model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out = _score(["-m", str(model_dir), "-p", str(PROMPTS), "-o", str(tmp_path / "r"), "--ray", "local",
                        "--generate-only"], capsys)
    assert code == 1 and "drop --generate-only" in out


def test_score_without_ray_says_how_to_install(model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)
    code, out = _score(["-m", str(model_dir), "-p", str(PROMPTS), "-o", str(tmp_path / "r"), "--ray", "auto",
                        "--limit", "2"], capsys)
    assert code == 1 and "pip install 'rcdiag[ray]'" in out
    assert not any((tmp_path / "r").glob("*/part-*.parquet"))


@pytest.mark.parametrize(("given", "expected"), [
    ("s3:/bucket/run", "s3://bucket/run"), ("file:/tmp/r", "file:///tmp/r"), ("s3://bucket/run", "s3://bucket/run"),
    ("runs/x", "runs/x"), ("/abs/x", "/abs/x"), ("C:/x", "C:/x"), ("", "")])
def test_normalize_out_undoes_path_collapsing(given: str, expected: str) -> None:
    assert normalize_out(given) == expected
    assert normalize_out(str(Path(expected))) == expected or not expected


def _shard(seq: int) -> tuple[pa.Table, pa.Table]:
    from rcdiag.store.writer import prepare_sequences, prepare_tokens

    tokens = prepare_tokens(pa.table({"seq_id": [seq, seq], "pos": [0, 1], "rollout_logprob": [-1.0, -2.0]}))
    return tokens, prepare_sequences(None, tokens)


def test_uri_writer_resumes_refuses_and_finishes(tmp_path: Path) -> None:
    uri = f"file://{tmp_path / 'run'}"
    assert is_uri(uri) and not is_uri(str(tmp_path))
    writer = open_writer(uri, {"a": 1})
    assert isinstance(writer, UriRunWriter) and writer.complete_shards() == []
    ShardSink(uri).write(0, *_shard(0))
    ShardSink(uri).write(2, *_shard(2))
    assert UriRunWriter(uri, {"a": 1}).complete_shards() == [0, 2]  # resumed: shards kept
    with pytest.raises(RunDirError, match="different settings"):
        UriRunWriter(uri, {"a": 2})
    assert UriRunWriter(uri, {"a": 2}, overwrite=True).complete_shards() == []
    writer = UriRunWriter(uri, {"a": 2})
    ShardSink(uri).write(0, *_shard(5))
    manifest = writer.finish({"source": {"kind": "test"}, "schema_version": 1})
    assert manifest["counts"] == {"sequences": 1, "tokens": 2, "shards": 1}
    run = open_run(tmp_path / "run")  # the local reader opens what the URI writer wrote
    assert run.manifest["spec"] == {"a": 2} and not (tmp_path / "run" / "pending.json").exists()
    assert run.tokens()["seq_id"].tolist() == [5, 5]
    assert not list((tmp_path / "run").glob("*/.*.tmp"))
    assert json.loads((tmp_path / "run" / "manifest.json").read_text())["counts"]["shards"] == 1


def test_local_paths_use_runwriter(tmp_path: Path) -> None:
    assert isinstance(open_writer(str(tmp_path / "run"), {"a": 1}), RunWriter)
