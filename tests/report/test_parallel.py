"""Parallel passes merge exactly like the sequential ones: bit-identical numbers (threads, read-ahead)."""
from __future__ import annotations

import numpy as np

import rcdiag
from rcdiag.analysis.chunks import iter_chunks
from rcdiag.analysis.correction import MODES, ISAccumulator, analyze
from rcdiag.analysis.metrics import MetricsAccumulator
from rcdiag.analysis.threads import ordered_map
from rcdiag.checks.verdicts import findings
from rcdiag.report.options import ReportOptions
from rcdiag.report.passes import run_passes
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
    assert par_lib.metrics.finish(par_lib.rows) == seq_lib.metrics.finish(seq_lib.rows)
    assert par_lib.sweep.finish(par_lib.rows) == seq_lib.sweep.finish(seq_lib.rows)
    for name, acc in seq_lib.rejections.items():
        assert par_lib.rejections[name].finish(par_lib.rows) == acc.finish(seq_lib.rows)
    assert par_scan.tails.finish() == seq_scan.tails.finish()
    assert par_scan.strata.finish() == seq_scan.strata.finish()
    np.testing.assert_array_equal(par_scan.sums.table()[1], seq_scan.sums.table()[1])
    def checks(scan):
        return [f.to_dict() for f in findings(scan.checks, (scan.info.seq_id, scan.info.response_len), run.manifest,
                                              (2.0,))]

    assert checks(par_scan) == checks(seq_scan)


def test_analyze_with_read_ahead_equals_a_plain_sequential_loop(tmp_path):
    """stream() reads ahead on a thread; the accumulators still see the same chunks in the same order."""
    run = _run(tmp_path)
    metrics, table = analyze(run, modes=tuple(MODES), thresholds=(2.0,))
    acc = MetricsAccumulator()
    modes = [m.with_bounds(2.0, None) for m in MODES.values()]
    is_acc = ISAccumulator(modes)
    for chunk in iter_chunks(run):
        acc.update_chunk(chunk)
        is_acc.update_chunk(chunk)
    rows = run.num_sequences
    assert metrics == acc.finish(rows)
    want = is_acc.finish(rows)
    got = table.drop(columns=[c for c in ("mode", "threshold") if c in table.columns]).to_dict("records")
    assert [{k: r[k] for k in got[0]} for r in want] == got
