"""Parallel passes merge exactly like the sequential ones: bit-identical numbers (threads, read-ahead)."""
from __future__ import annotations

import numpy as np

import rcdiag
from rcdiag.analysis.correction.modes import MODES, ISAccumulator
from rcdiag.analysis.metrics.compute import MetricsAccumulator, analyze
from rcdiag.analysis.passes.accum import Totals
from rcdiag.analysis.passes.chunks import iter_chunks
from rcdiag.analysis.passes.threads import ordered_map
from rcdiag.checks.verdicts import findings
from rcdiag.report.options import ReportOptions
from rcdiag.report.passes import run_passes
from tests.analysis.helpers import assert_close
from tests.fixtures.runs import SyntheticSpec, synthetic_frames


def _run(tmp_path):
    tokens, sequences = synthetic_frames(SyntheticSpec(noise=0.5, n_seq=60, seed=11))
    tokens.loc[tokens.seq_id == 5, "mask"] = False
    return rcdiag.write_run(tmp_path / "run", tokens, sequences, shard_tokens=300)


def test_report_passes_on_threads_equal_sequential_map(tmp_path):
    run = _run(tmp_path)
    assert len(run.token_files) >= 4
    options = ReportOptions()
    seq_scan, seq_lib = run_passes(run, options, map)
    par_scan, par_lib = run_passes(run, options, lambda fn, items: ordered_map(fn, items, threads=3))
    par, seq = par_lib.finish(Totals(par_lib.rows)), seq_lib.finish(Totals(seq_lib.rows))
    assert par.pop("gates").equals(seq.pop("gates")) and par == seq
    assert par_scan.tails.finish() == seq_scan.tails.finish()
    assert par_scan.strata.finish() == seq_scan.strata.finish()
    np.testing.assert_array_equal(par_scan.sums.table()[1], seq_scan.sums.table()[1])
    def checks(scan):
        return [f.to_dict() for f in findings(scan.checks, (scan.info.seq_id, scan.info.response_len), run.manifest,
                                              (2.0,))]

    assert checks(par_scan) == checks(seq_scan)


def _plain_loop(run, per_file: bool):
    """metrics and IS modes at C = 2 by a plain loop over iter_chunks: one pair of accumulators for the whole run,
    or (per_file) a fresh pair per token file merged in file order."""
    modes = [m.with_bounds(2.0, None) for m in MODES.values()]
    runs = [run.shard(k) for k in range(len(run.token_files))] if per_file else [run]
    acc, is_acc = MetricsAccumulator(), ISAccumulator(modes)
    for part in runs:
        file_acc, file_is = MetricsAccumulator(), ISAccumulator(modes)
        for chunk in iter_chunks(part):
            file_acc.update_chunk(chunk)
            file_is.update_chunk(chunk)
        acc.merge(file_acc)
        is_acc.merge(file_is)
    return acc.finish(Totals(run.num_sequences)), is_acc.finish(Totals(run.num_sequences))


def _records(table):
    return table.drop(columns=["mode", "threshold"]).to_dict("records")


def test_analyze_on_threads_equals_a_plain_loop_over_files(tmp_path, monkeypatch):
    """stream() maps a run's token files on a thread per core, each into fresh accumulators merged in file order:
    bit-identical to that loop written plainly, whatever the number of threads; and equal to ONE pair of
    accumulators fed every chunk up to the rounding of the merges (Chan's formula for the variances)."""
    run = _run(tmp_path)
    results = []
    for threads in ("1", "3"):
        monkeypatch.setenv("RCDIAG_THREADS", threads)
        results.append(analyze(run, modes=tuple(MODES), thresholds=(2.0,)))
    (metrics, table), (metrics_3, table_3) = results
    assert metrics == metrics_3 and _records(table) == _records(table_3)
    want_metrics, want_modes = _plain_loop(run, per_file=True)
    assert metrics == want_metrics
    assert [{k: r[k] for k in _records(table)[0]} for r in want_modes] == _records(table)
    one_metrics, one_modes = _plain_loop(run, per_file=False)
    assert_close(metrics, one_metrics, rel=1e-12, abs_tol=1e-15, what="[one stream]")
    for got, want in zip(_records(table), one_modes, strict=True):
        assert_close(got, {k: want[k] for k in got}, rel=1e-12, abs_tol=1e-15, what="[one stream, IS]")
