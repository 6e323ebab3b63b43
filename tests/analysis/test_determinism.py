"""Determinism (issue #32): the same run gives the same bits whatever the number of threads, the order the files'
tasks finish in, or whether they ran in other processes (as Ray workers do: pickled tasks, a fresh interpreter,
the parts pickled back) — for the report's numbers and for the library's calls."""
from __future__ import annotations

import multiprocessing
import pickle
from concurrent.futures import ProcessPoolExecutor
from typing import Any

import pytest

import rcdiag
from rcdiag.analysis.correction.modes import MODES
from rcdiag.analysis.metrics.compute import analyze
from rcdiag.analysis.passes.threads import ordered_map
from rcdiag.analysis.training.trend import trend
from rcdiag.report.build import build_report
from rcdiag.report.options import ReportOptions
from tests.distributed.test_report import snapshot
from tests.fixtures.runs import SyntheticSpec, synthetic_frames

OPTIONS = ReportOptions(replicates=50)


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """Heavy-tailed mismatch, masked rows, steps, 8+ token files."""
    tokens, sequences = synthetic_frames(SyntheticSpec(noise=0.8, n_seq=160, seed=17))
    tokens.loc[tokens.seq_id % 11 == 0, "mask"] = False
    sequences["step"] = sequences["seq_id"] // 40
    return rcdiag.write_run(tmp_path_factory.mktemp("det") / "run", tokens, sequences, shard_tokens=300)


def _threads(n: int):
    return lambda fn, items: ordered_map(fn, items, threads=n)


def _last_first(fn, items):
    """Compute the files last to first (as tasks may finish), yield them in file order (what the map promises)."""
    items = list(items)
    done = {i: fn(i) for i in reversed(items)}
    return (done[i] for i in items)


def _in_processes(fn, items):
    """Each file's task in a fresh interpreter, its part pickled back: the path a Ray task takes."""
    items = list(items)
    with ProcessPoolExecutor(max_workers=2, mp_context=multiprocessing.get_context("spawn")) as pool:
        yield from (pickle.loads(blob) for blob in pool.map(_pickled_call, [fn] * len(items), items))


def _pickled_call(fn, index):
    return pickle.dumps(fn(index), protocol=5)


def test_report_numbers_are_the_same_bits_however_the_files_are_mapped(run):
    """Guards against a merge that follows completion order, a reduction whose result depends on which thread ran
    it, and state a task keeps outside what it returns (a Ray worker would not have it)."""
    assert len(run.token_files) >= 8
    want = snapshot(build_report(run, OPTIONS, map_files=map))
    for mapper in (_threads(1), _threads(2), _threads(4), _last_first, _in_processes):
        assert snapshot(build_report(rcdiag.open_run(run.path), OPTIONS, map_files=mapper)) == want


@pytest.mark.parametrize("threads", ["1", "2", "5"])
def test_library_calls_are_the_same_bits_on_any_number_of_threads(run, monkeypatch, threads):
    """analyze (every metric and the four IS modes) and the per-step trend: the same bits as on one thread."""
    monkeypatch.setenv("RCDIAG_THREADS", "1")
    metrics, table = analyze(run, modes=tuple(MODES), thresholds=(1.5, 2.0))
    frame = trend(run, replicates=30)
    monkeypatch.setenv("RCDIAG_THREADS", threads)
    metrics_n, table_n = analyze(run, modes=tuple(MODES), thresholds=(1.5, 2.0))
    assert repr(metrics_n) == repr(metrics)
    assert table_n.to_json() == table.to_json()
    assert trend(run, replicates=30).to_json() == frame.to_json()


def _metrics_json(run, out, map_files=None) -> dict[str, Any]:
    """metrics.json of `rcdiag report` (make_report, as the command writes it) without what names the output's place
    and time — every number, verdict and setting kept."""
    import json

    from rcdiag.report.make import make_report

    result = make_report([rcdiag.open_run(run.path)], out, OPTIONS, map_files=map_files)
    data = json.loads((result.out / "metrics.json").read_text())
    return _without_places(data, str(out))


def _without_places(value: Any, out: str) -> Any:
    if isinstance(value, dict):
        return {k: _without_places(v, out) for k, v in value.items() if k not in ("created", "generated")}
    if isinstance(value, list):
        return [_without_places(v, out) for v in value]
    return value.replace(out, "OUT") if isinstance(value, str) else value


def _equal_bits(got: Any, want: Any, where: str = "") -> list[str]:
    """Paths of every value that differs — floats compared by their bits (repr round-trips a double; NaN = NaN)."""
    if isinstance(want, dict) and isinstance(got, dict):
        keys = sorted(set(want) | set(got))
        return [p for k in keys for p in _equal_bits(got.get(k, "<missing>"), want.get(k, "<missing>"), f"{where}.{k}")]
    if isinstance(want, list) and isinstance(got, list) and len(want) == len(got):
        return [p for i, (g, w) in enumerate(zip(got, want, strict=True)) for p in _equal_bits(g, w, f"{where}[{i}]")]
    return [] if repr(got) == repr(want) else [f"{where}: {got!r} != {want!r}"]


def test_metrics_json_is_the_same_bits_on_any_number_of_threads_and_file_order(run, tmp_path, monkeypatch):
    """The file a CI gate reads: every number of metrics.json the same bits with RCDIAG_THREADS = 1, 2 and 5 (the
    project's thread setting, threads.workers), files computed last to first, and each file in another process.
    Guards a reduction that depends on the pool's size — what the library-level tests cannot see, since the
    report also runs the bootstrap's threads and the figure process."""
    monkeypatch.setenv("RCDIAG_THREADS", "1")
    want = _metrics_json(run, tmp_path / "one")
    assert want["counts"]["token_rows"] == run.num_tokens and len(want["gate_sweep"]) > 100
    for threads in ("2", "5"):
        monkeypatch.setenv("RCDIAG_THREADS", threads)
        assert _equal_bits(_metrics_json(run, tmp_path / f"t{threads}"), want) == []
    assert _equal_bits(_metrics_json(run, tmp_path / "last", _last_first), want) == []
    assert _equal_bits(_metrics_json(run, tmp_path / "procs", _in_processes), want) == []


def test_metrics_json_is_the_same_bits_on_ray(run, tmp_path, monkeypatch):
    """--ray: the per-file parts as Ray tasks (a local 2-CPU cluster) give metrics.json's bits of one thread."""
    ray = pytest.importorskip("ray")
    from rcdiag.distributed.report import ray_map

    monkeypatch.setenv("RCDIAG_THREADS", "1")
    want = _metrics_json(run, tmp_path / "local")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    try:
        assert _equal_bits(_metrics_json(run, tmp_path / "ray", ray_map(ray)), want) == []
    finally:
        ray.shutdown()


def test_equal_bits_sees_one_ulp():
    """The comparison itself: one ulp in a nested float is a difference, NaN equals NaN."""
    import math

    want = {"a": [1.0, {"b": 0.1}], "n": math.nan}
    assert _equal_bits({"a": [1.0, {"b": 0.1}], "n": math.nan}, want) == []
    assert _equal_bits({"a": [1.0, {"b": math.nextafter(0.1, 1)}], "n": math.nan}, want) == [
        ".a[1].b: 0.10000000000000002 != 0.1"]


def test_ordered_map_keeps_order_and_runs_one_item_on_the_caller():
    """One item needs no pool (the per-step bootstraps of a long run started and joined 1,000 of them); several
    go to the pool threads; either way the results come in input order, whatever finishes first."""
    import threading
    import time

    def where(i: int) -> tuple[int, str]:
        time.sleep(0.02 if i == 0 else 0.0)  # the first item finishes last
        return i, threading.current_thread().name

    assert list(ordered_map(where, [7], threads=4)) == [(7, threading.current_thread().name)]
    got = list(ordered_map(where, iter(range(6)), threads=3))
    assert [i for i, _ in got] == list(range(6))
    assert all(name.startswith("rcdiag-pass") for _, name in got)
    assert list(ordered_map(lambda i: i * i, iter(range(5)), threads=1)) == [0, 1, 4, 9, 16]
    assert list(ordered_map(lambda i: i, [], threads=4)) == []
