"""`rcdiag report --ray`: per-file partial accumulators as Ray tasks, merged in file order, equal the local
report exactly — on clean and adversarial multi-file runs — and the per-file merge agrees with one pass."""
from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from rcdiag.analysis.metrics.compute import compute_metrics
from rcdiag.cli import main
from rcdiag.distributed.report import ray_map
from rcdiag.report.build import build_report
from rcdiag.report.options import ReportOptions
from rcdiag.store.run import open_run
from tests.fixtures.runs import build_run

OPTIONS = ReportOptions(replicates=40)
SECTIONS = ("metrics", "metrics_error", "intervals", "tails", "strata", "worst_tokens", "worst_sequences",
            "prompts", "is_modes", "rejection", "recommendation")


def snapshot(report: Any) -> str:
    """Every number and verdict of a report as exact JSON (floats round-trip; NaN as NaN)."""
    data = {name: getattr(report, name) for name in SECTIONS}
    data["sweep"] = report.sweep.to_dict("list") if report.sweep is not None else None
    data["checks"] = [vars(f) if hasattr(f, "__dict__") else repr(f) for f in report.checks]
    data["counts"] = report.counts
    return json.dumps(data, sort_keys=True, default=repr)


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("ray_report_runs")
    built = {name: build_run(root / name, name, shard_tokens=250, n_seq=90)
             for name in ("clean", "nan_placeholder", "count_mismatch", "bf16")}
    swapped = root / "swapped"  # files out of key order: the first file holds the later sequences
    shutil.copytree(built["clean"].path, swapped)
    for sub in ("tokens", "sequences"):
        first, second = swapped / sub / "part-00000.parquet", swapped / sub / "part-00001.parquet"
        first.rename(swapped / sub / "tmp.parquet")
        second.rename(first)
        (swapped / sub / "tmp.parquet").rename(second)
    built["swapped"] = open_run(swapped)
    return built


@pytest.mark.parametrize("name", ["clean", "nan_placeholder", "count_mismatch", "bf16", "swapped"])
def test_ray_report_equals_local(ray_cluster: Any, runs: dict[str, Any], name: str) -> None:
    run = runs[name]
    assert len(run.token_files) >= 4
    local = build_report(run, OPTIONS)
    remote = build_report(run, OPTIONS, map_files=ray_map(ray_cluster))
    assert snapshot(remote) == snapshot(local)


def test_adversarial_runs_take_the_expected_paths(runs: dict[str, Any]) -> None:
    """The NaN run and the out-of-order run are refused by the metrics, naming the file; the others are not."""
    assert "NaN" in build_report(runs["nan_placeholder"], OPTIONS).metrics_error
    swapped = build_report(runs["swapped"], OPTIONS).metrics_error
    assert swapped is not None and "tokens/part-00001.parquet" in swapped
    assert build_report(runs["clean"], OPTIONS).metrics_error is None


@pytest.mark.parametrize("name", ["clean", "count_mismatch", "bf16"])
def test_file_merge_matches_one_pass(runs: dict[str, Any], name: str) -> None:
    """Merging per-file accumulators gives the single-pass compute_metrics numbers (to float64 rounding)."""
    merged = build_report(runs[name], OPTIONS).metrics
    single = compute_metrics(runs[name])
    assert merged.keys() == single.keys()
    for key, value in single.items():
        assert np.isclose(merged[key], value, rtol=1e-12, atol=1e-15, equal_nan=True), key


def _cli(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    code = main(["report", *args])
    captured = capsys.readouterr()
    return code, captured.out + captured.err


def test_cli_ray_writes_the_same_metrics(ray_cluster: Any, runs: dict[str, Any], tmp_path: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    run = str(runs["count_mismatch"].path)
    local = _cli([run, "--quiet", "--out", str(tmp_path / "local")], capsys)
    remote = _cli([run, "--quiet", "--out", str(tmp_path / "ray"), "--ray", "auto"], capsys)
    assert local[0] == 0, local[1]
    assert remote[0] == 0, remote[1]
    read = [json.loads((tmp_path / d / "metrics.json").read_text()) for d in ("local", "ray")]
    for doc in read:
        doc.pop("generated", None)
    assert json.dumps(read[0], sort_keys=True) == json.dumps(read[1], sort_keys=True)


def test_without_ray_the_error_says_how_to_install(monkeypatch: pytest.MonkeyPatch, runs: dict[str, Any],
                                                   tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` now raises ImportError
    code, output = _cli([str(runs["clean"].path), "--quiet", "--out", str(tmp_path / "r"), "--ray", "auto"], capsys)
    assert code == 1
    assert "Error: --ray needs Ray, which is not installed: pip install 'rcdiag[ray]'" in output
    assert not (tmp_path / "r").exists()


def test_bad_ray_address_is_a_clear_error(runs: dict[str, Any], tmp_path: Path) -> None:
    from rcdiag.distributed import parse_address
    from rcdiag.errors import ConfigError

    assert parse_address("auto") == "auto" and parse_address("LOCAL") is None
    assert parse_address("ray://head:10001") == "ray://head:10001"
    with pytest.raises(ConfigError, match="auto, local or a cluster address"):
        parse_address("  ")
