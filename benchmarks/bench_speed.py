"""Benchmark: issue #15's targets in ONE run — report pass and analyze vs the bare read (and DuckDB), start-up.

    python benchmarks/bench_speed.py --tokens 10e6            # builds (or reuses) the run under --dir
    python benchmarks/bench_speed.py --tokens 2e6 --quick     # fewer repeats

Each method runs in a fresh spawned interpreter (peak RSS its own; numba kernels loaded from the on-disk cache by
a warm-up on a 2,000-token run first, so compile time is not counted). Methods:
  read        pyarrow: stream the 7 token columns the report reads, file by file (the floor the ratios use; no
              rcdiag door check — the other methods open the run as a user does, validation included)
  read-a      pyarrow: the 5 columns analyze reads (analyze's own floor)
  read-cores  the same as read with the files on a thread per core, as the passes read them (the floor of a parallel pass)
  passes-1    the report's passes (scan + metrics/IS sweep/rejection accumulators) on ONE thread (no cache)
  passes      the same on a thread per core (rcdiag's default)
  analyze     rcdiag.analysis.correction.analyze: every metric + the 4 IS modes at C = 2 (a thread per core)
  duckdb      one SQL query over the same Parquet files: the same metrics + the 4 IS modes (all cores)
  passes-nogates  the report's passes without the gate families' sweep (what the rest of the pass costs)
  report      `rcdiag report` (make_report: passes, bootstrap 1,000 replicates, plots, files), cache off
  overview    the dashboard's first Overview (streamlit AppTest) with an empty pass cache
and, with `report`, the start-up: `rcdiag report` as a command on a 2,000-token run (wall; the fixed cost),
`rcdiag --help`, and `rcdiag report runs/sample` when the README's sample run exists (its manifest names a real
tokenizer: the report decodes its worst tokens, as a user's run does and the synthetic runs do not).
Prints the best wall and best CPU seconds of --repeats runs, tokens/s, each ratio against the read, analyze vs
DuckDB, peak RSS and minor page faults (the process's, warm-up and all repeats included).
"""
from __future__ import annotations

import argparse
import multiprocessing
import os
import resource
import subprocess
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_metrics import build_run  # noqa: E402  (the shared shard-by-shard builder)

SAMPLE_RUN = Path(__file__).resolve().parents[1] / "runs" / "sample"
"""The README's sample run (made by its `rcdiag score` command), measured when present."""
REPORT_COLUMNS = ["seq_id", "pos", "token_id", "rollout_logprob", "train_logprob", "train_entropy", "mask"]
ANALYZE_COLUMNS = ["seq_id", "pos", "rollout_logprob", "train_logprob", "mask"]
MODES = ("token_truncate", "token_mask", "sequence_truncate", "sequence_mask")
DUCKDB_SQL = """
WITH t AS (SELECT seq_id, train_logprob::DOUBLE AS a, rollout_logprob::DOUBLE AS b,
                  train_logprob::DOUBLE - rollout_logprob::DOUBLE AS l
           FROM read_parquet('{glob}') WHERE mask),
r AS (SELECT *, exp(greatest(least(l, 20), -20)) AS rho FROM t),
s AS (SELECT seq_id, count(*) AS n, sum(a) AS sa, sum(b) AS sb, sum(l) AS sl,
             sum(least(rho, {c})) AS w_tt, sum(least(rho, {c}) ^ 2) AS w2_tt,
             sum(CASE WHEN rho <= {c} THEN rho ELSE 0 END) AS w_tm,
             sum(CASE WHEN rho <= {c} THEN rho * rho ELSE 0 END) AS w2_tm,
             sum((exp(greatest(least(l, 20), -20)) - 1) - greatest(least(l, 20), -20)) AS k3,
             sum(rho * rho - 1) AS chi2
      FROM r GROUP BY seq_id),
q AS (SELECT *, exp(greatest(least(sl / n, 20), -20)) AS seq_rho FROM s)
SELECT -sum(sl) / sum(n) AS kl, sum(k3) / sum(n) AS k3_kl, sum(chi2) / sum(n) AS chi2_token,
       avg(-sa / n) AS training_log_ppl, avg(exp(-sa / n)) AS training_ppl, avg(-sb / n) AS rollout_log_ppl,
       avg(exp(-sb / n)) AS rollout_ppl, avg(-sl / n) AS log_ppl_diff, avg(abs(sl / n)) AS log_ppl_abs_diff,
       max(-sl / n) AS log_ppl_diff_max, min(-sl / n) AS log_ppl_diff_min, avg(exp(-sl / n)) AS ppl_ratio,
       avg(exp(2 * greatest(least(sl / n, 20), -20)) - 1) AS chi2_seq,
       sum(w_tt) / sum(n) AS tt_mean, (sum(w_tt) / sum(n)) ^ 2 / (sum(w2_tt) / sum(n)) AS tt_ess,
       sum(w_tm) / sum(n) AS tm_mean, (sum(w_tm) / sum(n)) ^ 2 / (sum(w2_tm) / sum(n)) AS tm_ess,
       sum(least(seq_rho, {c}) * n) / sum(n) AS st_mean,
       sum(CASE WHEN seq_rho <= {c} THEN seq_rho * n ELSE 0 END) / sum(n) AS sm_mean,
       avg(CASE WHEN seq_rho > {c} THEN 1.0 ELSE 0.0 END) AS seq_clipped
FROM q
"""


def build_steps_run(path: Path, steps: int, per_step: int = 8, length: int = 250, seed: int = 0) -> None:
    """A run of `steps` training steps, `per_step` sequences of ~`length` tokens each (the per-step sections'
    case: a trend row, a verdict and a drift test per step, from one pass)."""
    import numpy as np
    import pyarrow as pa

    from rcdiag.store.manifest import new_manifest
    from rcdiag.store.schema import TOKEN_SCHEMA
    from rcdiag.store.writer import RunWriter, prepare_sequences

    rng = np.random.default_rng(seed)
    writer = RunWriter(path, {"bench_steps": steps, "seed": seed}, overwrite=True)
    per_shard = max(1, 1_000_000 // (per_step * length))
    for index, first in enumerate(range(0, steps, per_shard)):
        step = np.repeat(np.arange(first, min(first + per_shard, steps)), per_step)
        lengths = rng.integers(length // 2, 3 * length // 2, step.size)
        ids = np.arange(first * per_step, first * per_step + step.size, dtype=np.int64)
        n = int(lengths.sum())
        b = -rng.exponential(1.5, n)
        drift = np.repeat(0.02 * (1 + step / steps), lengths)
        table = pa.table({
            "seq_id": np.repeat(ids, lengths), "pos": (np.arange(n) - np.repeat(np.cumsum(lengths) - lengths,
                                                                                  lengths)).astype(np.int32),
            "token_id": rng.integers(0, 50_000, n, dtype=np.int32), "rollout_logprob": b.astype(np.float32),
            "train_logprob": (b + rng.normal(0.0, drift)).astype(np.float32),
            "train_entropy": rng.random(n, dtype=np.float32), "mask": rng.random(n) >= 0.02}, schema=TOKEN_SCHEMA)
        sequences = prepare_sequences(pa.table({"seq_id": ids, "step": step}), table)
        writer.write_shard(index, table, sequences)
    writer.finish(new_manifest("bench"))


def _bare_run(run_path: str):
    """The run without rcdiag's door check (rcdiag.store.validate reads every file's seq_id column: 0.9 s of a
    50 M-token run before issue #15's last round, which the "bare read" used to include and so flattered every
    ratio): what is left is pyarrow's iter_batches over the token files."""
    from rcdiag.store.run import Run

    return Run(run_path, validate=False)


def method_read(run_path: str) -> int:
    return sum(batch.num_rows for _, batch in _bare_run(run_path).iter_batches(REPORT_COLUMNS))


def method_read_analyze(run_path: str) -> int:
    """The bare read of the five columns analyze reads (its own floor; `read` has the report's seven)."""
    return sum(batch.num_rows for _, batch in _bare_run(run_path).iter_batches(ANALYZE_COLUMNS))


def method_read_cores(run_path: str) -> int:
    from rcdiag.analysis.threads import ordered_map

    run = _bare_run(run_path)
    files = [run.shard(k) for k in range(len(run.token_files))]
    return sum(ordered_map(lambda shard: sum(b.num_rows for _, b in shard.iter_batches(REPORT_COLUMNS)), files))


def _passes(run_path: str, threads: int | None) -> int:
    import rcdiag
    from rcdiag.analysis.accum import Totals
    from rcdiag.analysis.threads import ordered_map
    from rcdiag.report.options import ReportOptions
    from rcdiag.report.passes import run_passes

    run = rcdiag.open_run(run_path)
    scan, library = run_passes(run, ReportOptions(), lambda fn, items: ordered_map(fn, items, threads=threads))
    assert library.finish(Totals(library.rows))["metrics"]["tokens"] > 0
    return int(scan.checks.tokens)


def method_passes_1(run_path: str) -> int:
    return _passes(run_path, 1)


def method_passes(run_path: str) -> int:
    return _passes(run_path, None)


def method_passes_nogates(run_path: str) -> int:
    """The report's passes without the gate families' sweep (issue #30's ~130 settings): what the rest costs."""
    from rcdiag.errors import InputError
    from rcdiag.report import passes

    def no_gates(shard):
        raise InputError("gate sweep left out (benchmark)")

    passes.report_gates = no_gates
    return _passes(run_path, None)


def method_overview(run_path: str) -> int:
    """The dashboard's first Overview of the run (streamlit's AppTest), the pass cache empty (a fresh directory)."""
    import tempfile

    from streamlit.testing.v1 import AppTest

    os.environ["RCDIAG_CACHE_DIR"] = tempfile.mkdtemp(prefix="rcdiag-bench-cache-")
    app_file = Path(__file__).resolve().parents[1] / "app" / "dashboard.py"
    sys.argv = [str(app_file), run_path]
    app = AppTest.from_file(str(app_file), default_timeout=1800)
    app.run()
    if app.exception or app.error:
        raise SystemExit(f"overview: {[e.value for e in (*app.exception, *app.error)]}")
    import rcdiag

    return rcdiag.open_run(run_path).num_tokens


def method_analyze(run_path: str) -> int:
    import rcdiag
    from rcdiag.analysis.correction import analyze

    metrics, table = analyze(rcdiag.open_run(run_path), modes=MODES, thresholds=(2.0,))
    assert len(table) == 4
    return int(metrics["tokens"])


def method_duckdb(run_path: str) -> int:
    import duckdb

    con = duckdb.connect()
    row = con.execute(DUCKDB_SQL.format(glob=f"{run_path}/tokens/*.parquet", c=2.0)).fetchone()
    assert row[0] == row[0]
    return int(con.execute(f"SELECT count(*) FROM read_parquet('{run_path}/tokens/*.parquet')").fetchone()[0])


def method_report(run_path: str) -> int:
    os.environ["RCDIAG_CACHE_DIR"] = "off"
    import rcdiag
    from rcdiag.report.make import make_report
    from rcdiag.report.options import ReportOptions

    result = make_report([rcdiag.open_run(run_path)], Path(run_path) / "report", ReportOptions())
    return result.reports[0].counts["token_rows"]


METHODS = {"read": method_read, "read-a": method_read_analyze, "read-cores": method_read_cores,
           "passes-1": method_passes_1, "passes": method_passes, "passes-nogates": method_passes_nogates,
           "analyze": method_analyze, "duckdb": method_duckdb, "report": method_report, "overview": method_overview}


def _measure(name: str, run_path: str, repeats: int = 1) -> dict[str, float]:
    """Best wall and best CPU seconds of `repeats` runs (a shared machine's neighbours only ever add time)."""
    best = {"seconds": float("inf"), "cpu": float("inf")}
    for _ in range(repeats):
        start, cpu = time.perf_counter(), time.process_time()
        rows = METHODS[name](run_path)
        best = {"seconds": min(best["seconds"], time.perf_counter() - start),
                "cpu": min(best["cpu"], time.process_time() - cpu)}
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return {**best, "rows": rows, "rss_mib": usage.ru_maxrss / 1024, "faults_k": usage.ru_minflt / 1e3}


def measure(name: str, run_path: Path, warm: Path, repeats: int = 1) -> dict[str, float]:
    """Best of `repeats` runs of the method in one fresh process, after a warm-up on `warm` (loads the numba
    cache; peak RSS is the process's, warm-up included)."""
    with ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn")) as pool:
        if name != "duckdb":
            pool.submit(_measure, name, str(warm)).result()
        return pool.submit(_measure, name, str(run_path), repeats).result()


def command_seconds(args: list[str], repeats: int) -> float:
    """Best wall seconds of `python -m rcdiag ARGS` (a fresh interpreter each time, as a user runs it)."""
    env = {**os.environ, "RCDIAG_CACHE_DIR": "off"}
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        subprocess.run([sys.executable, "-m", "rcdiag", *args], check=True, capture_output=True, env=env)
        best = min(best, time.perf_counter() - start)
    return best


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=float, default=10e6)
    parser.add_argument("--shard-tokens", type=int, default=1_000_000)
    parser.add_argument("--dir", type=Path, default=Path("/tmp/rcdiag-bench"))
    parser.add_argument("--methods", default=",".join(METHODS), help="comma-separated subset")
    parser.add_argument("--quick", action="store_true", help="one start-up repeat instead of three")
    parser.add_argument("--repeats", type=int, default=3, help="runs of each method (best wall, best CPU)")
    parser.add_argument("--runs", type=Path, nargs="*", default=[],
                        help="more run directories to time `rcdiag report` on (the sample run, a real model's)")
    parser.add_argument("--steps", type=int, default=0, help="also build and time a run of this many steps")
    args = parser.parse_args(argv)
    n = int(args.tokens)
    paths = {}
    for key, size in (("large", n), ("tiny", 2_000)):
        paths[key] = args.dir / f"run-{size}"
        if not (paths[key] / "manifest.json").exists():
            build_run(paths[key], size, args.shard_tokens)
    if args.steps:
        paths["steps"] = args.dir / f"run-steps-{args.steps}"
        if not (paths["steps"] / "manifest.json").exists():
            build_steps_run(paths["steps"], args.steps)
        args.runs = [*args.runs, paths["steps"]]
    results = {m: measure(m, paths["large"], paths["tiny"], args.repeats if m != "overview" else 1)
               for m in args.methods.split(",")}
    print(f"\n{n:,} tokens, {len(os.sched_getaffinity(0))} CPUs, load average {os.getloadavg()[0]:.1f}")
    print(f"{'method':<10}{'wall s':>9}{'CPU s':>9}{'Mtok/s':>9}{'× read':>9}{'× read CPU':>12}{'RSS MiB':>9}"
          f"{'faults k':>10}")
    read = results.get("read")
    for name, r in results.items():
        ratio = r["seconds"] / read["seconds"] if read else float("nan")
        cpu_ratio = r["cpu"] / read["cpu"] if read else float("nan")
        print(f"{name:<10}{r['seconds']:>9.2f}{r['cpu']:>9.2f}{r['rows'] / r['seconds'] / 1e6:>9.2f}{ratio:>9.2f}"
              f"{cpu_ratio:>12.2f}{r['rss_mib']:>9.0f}{r['faults_k']:>10.0f}")
    if "analyze" in results and "read-a" in results:
        print(f"analyze vs the read of its own 5 columns: {results['analyze']['seconds'] / results['read-a']['seconds']:.2f}× "
              f"wall, {results['analyze']['cpu'] / results['read-a']['cpu']:.2f}× CPU")
    if "analyze" in results and "duckdb" in results:
        print(f"analyze speed vs DuckDB: {results['duckdb']['seconds'] / results['analyze']['seconds']:.2f}× "
              "(> 1: rcdiag faster)")
    if "report" in args.methods:
        repeats = 1 if args.quick else 3
        print(f"start-up: `rcdiag report` on 2,000 tokens {command_seconds(['report', str(paths['tiny']), '--quiet', '--out', str(args.dir / 'tiny-report')], repeats):.2f} s, "
              f"`rcdiag report --help` {command_seconds(['report', '--help'], repeats):.2f} s, "
              f"`rcdiag --help` {command_seconds(['--help'], repeats):.2f} s (wall, best of {repeats})")
        for extra in args.runs:  # the sample run, a real model's, a many-step run: `rcdiag report` as a user runs it
            seconds = command_seconds(['report', str(extra), '--quiet', '--out', str(args.dir / f'{extra.name}-report')],
                                      repeats)
            print(f"`rcdiag report {extra}` (no cache) {seconds:.2f} s")
        if (SAMPLE_RUN / "manifest.json").is_file():  # what a user runs first: a real tokenizer decodes its worst tokens
            seconds = command_seconds(['report', str(SAMPLE_RUN), '--quiet', '--out', str(args.dir / 'sample-report')],
                                      repeats)
            print(f"`rcdiag report runs/sample` (the README's run, its tokenizer decoding the worst tokens, no "
                  f"cache) {seconds:.2f} s")


if __name__ == "__main__":
    main()
