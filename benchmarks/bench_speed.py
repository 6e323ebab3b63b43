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
  analyze     rcdiag.analysis.metrics.compute.analyze: every metric + the 4 IS modes at C = 2 (a thread per core)
  duckdb      one SQL query over the same Parquet files: every number analyze returns (its 16 metrics, the 4 IS
              modes' 10 metrics each), checked against analyze's before the timing (all cores)
  duckdb-20   the query of #32's first figures: 20 of those 56 numbers
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
import json
import os
import resource
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_metrics import build_run  # noqa: E402  (the shared shard-by-shard builder)

SAMPLE_RUN = Path(__file__).resolve().parents[1] / "runs" / "sample"
"""The README's sample run (made by its `rcdiag score` command), measured when present."""
REPORT_COLUMNS = ["seq_id", "pos", "token_id", "rollout_logprob", "train_logprob", "train_entropy", "mask"]
ANALYZE_COLUMNS = ["seq_id", "pos", "rollout_logprob", "train_logprob", "mask"]
MODES = ("token_truncate", "token_mask", "sequence_truncate", "sequence_mask")
DUCKDB_LEAN_SQL = """
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
"""The query of #32's first figures: 20 of analyze's 56 numbers (no IS std / min / max / fractions, ESS of two
modes only) — kept as `duckdb-20` so those figures can be re-measured; `duckdb` computes all 56."""
DUCKDB_SQL = """
WITH t AS (SELECT seq_id, train_logprob::DOUBLE AS a, rollout_logprob::DOUBLE AS b,
                  train_logprob::DOUBLE - rollout_logprob::DOUBLE AS l
           FROM read_parquet('{glob}') WHERE mask),
r AS (SELECT *, exp(greatest(least(l, 20), -20)) AS rho FROM t),
w AS (SELECT *, least(rho, {c}) AS w_tt, CASE WHEN rho <= {c} THEN rho ELSE 0 END AS w_tm FROM r),
s AS (SELECT seq_id, count(*) AS n, sum(a) AS sa, sum(b) AS sb, sum(l) AS sl,
             sum(w_tt) AS w_tt, sum(w_tt * w_tt) AS w2_tt, min(w_tt) AS lo_tt, max(w_tt) AS hi_tt,
             sum(w_tm) AS w_tm, sum(w_tm * w_tm) AS w2_tm, min(w_tm) AS lo_tm, max(w_tm) AS hi_tm,
             sum(CASE WHEN rho > {c} THEN 1 ELSE 0 END) AS clip_t, sum(CASE WHEN rho < 1 / {c} THEN 1 ELSE 0 END) AS low_t,
             sum((exp(greatest(least(l, 20), -20)) - 1) - greatest(least(l, 20), -20)) AS k3,
             sum(rho * rho - 1) AS chi2
      FROM w GROUP BY seq_id),
q AS (SELECT *, exp(greatest(least(sl / n, 20), -20)) AS seq_rho FROM s),
v AS (SELECT *, least(seq_rho, {c}) AS w_st, CASE WHEN seq_rho <= {c} THEN seq_rho ELSE 0 END AS w_sm FROM q),
g AS (SELECT sum(n) AS nt, count(*) AS ns,
             sum(w_tt) AS tt1, sum(w2_tt) AS tt2, min(lo_tt) AS tt_lo, max(hi_tt) AS tt_hi,
             sum(w_tm) AS tm1, sum(w2_tm) AS tm2, min(lo_tm) AS tm_lo, max(hi_tm) AS tm_hi, sum(clip_t) AS clip_t, sum(low_t) AS low_t, sum(CASE WHEN seq_rho < 1 / {c} THEN 1 ELSE 0 END) AS low_s,
             sum(CASE WHEN clip_t < n THEN 1 ELSE 0 END) AS tm_seqs,
             sum(w_st * n) AS st1, sum(w_st * w_st * n) AS st2, min(w_st) AS st_lo, max(w_st) AS st_hi,
             sum(w_sm * n) AS sm1, sum(w_sm * w_sm * n) AS sm2, min(w_sm) AS sm_lo, max(w_sm) AS sm_hi,
             sum(CASE WHEN seq_rho > {c} THEN 1 ELSE 0 END) AS clip_s,
             sum(CASE WHEN seq_rho > {c} THEN 0 ELSE n END) AS sm_tokens,
             -sum(sl) / sum(n) AS kl, sum(k3) / sum(n) AS k3_kl, sum(chi2) / sum(n) AS chi2_token,
             avg(-sa / n) AS training_log_ppl, avg(exp(-sa / n)) AS training_ppl, avg(-sb / n) AS rollout_log_ppl,
             avg(exp(-sb / n)) AS rollout_ppl, avg(-sl / n) AS log_ppl_diff, avg(abs(sl / n)) AS log_ppl_abs_diff,
             max(-sl / n) AS log_ppl_diff_max, min(-sl / n) AS log_ppl_diff_min, avg(exp(-sl / n)) AS ppl_ratio,
             avg(exp(2 * greatest(least(sl / n, 20), -20)) - 1) AS chi2_seq
      FROM v)
SELECT (SELECT count(*) FROM read_parquet('{seq_glob}')) AS sequences,
       (SELECT count(*) FROM read_parquet('{seq_glob}')) - ns AS empty_sequences, kl, k3_kl, chi2_token, training_log_ppl, training_ppl, rollout_log_ppl, rollout_ppl, log_ppl_diff,
       log_ppl_abs_diff, log_ppl_diff_max, log_ppl_diff_min, ppl_ratio, chi2_seq, nt,
       tt1 / nt, sqrt(greatest(tt2 / nt - (tt1 / nt) ^ 2, 0)), tt_lo, tt_hi, (tt1 / nt) ^ 2 / (tt2 / nt),
       clip_t / nt, clip_t / nt, low_t / nt, 1::DOUBLE, 1::DOUBLE,
       tm1 / nt, sqrt(greatest(tm2 / nt - (tm1 / nt) ^ 2, 0)), tm_lo, tm_hi, (tm1 / nt) ^ 2 / (tm2 / nt),
       clip_t / nt, clip_t / nt, low_t / nt, (nt - clip_t) / nt, tm_seqs / ns,
       st1 / nt, sqrt(greatest(st2 / nt - (st1 / nt) ^ 2, 0)), st_lo, st_hi, (st1 / nt) ^ 2 / (st2 / nt),
       clip_s / ns, clip_s / ns, low_s / ns, 1::DOUBLE, 1::DOUBLE,
       sm1 / nt, sqrt(greatest(sm2 / nt - (sm1 / nt) ^ 2, 0)), sm_lo, sm_hi, (sm1 / nt) ^ 2 / (sm2 / nt),
       clip_s / ns, clip_s / ns, low_s / ns, sm_tokens / nt, (ns - clip_s) / ns
FROM g
"""
"""One query for EVERY number analyze returns (its 16 metrics, the 4 modes' 10 IS metrics each at C = 2, canonical
convention; `check_duckdb` compares them with analyze's before anything is timed). The std is DuckDB's cheapest form,
√(E[w²] − E[w]²): within ~1e-10 relative of analyze's two-pass std on these runs."""
DUCKDB_NAMES = (
    "sequences", "empty_sequences", "kl", "k3_kl", "chi2_token", "training_log_ppl", "training_ppl", "rollout_log_ppl", "rollout_ppl",
    "log_ppl_diff", "log_ppl_abs_diff", "log_ppl_diff_max", "log_ppl_diff_min", "ppl_ratio", "chi2_seq", "tokens",
    *(f"{mode}.{k}" for mode in MODES for k in (
        "is_weight_mean", "is_weight_std", "is_weight_min", "is_weight_max", "ess", "clipped_frac", "fraction_high",
        "fraction_low", "kept_token_frac", "kept_seq_frac")))
"""DUCKDB_SQL's columns in order, as analyze's metric names (mode.metric for the IS table)."""


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


def _read(run_path: str, columns: list[str]) -> int:
    """The bare read: pyarrow's iter_batches over the token files, in the passes' batch size, nothing else — no
    rcdiag door check (rcdiag.store.validate: 0.9 s of a 50 M-token run before issue #15's last round, which the
    "bare read" used to include and so flattered every ratio), no rcdiag code at all (the same floor for both trees)."""
    import pyarrow.parquet as pq

    from rcdiag.analysis.passes.chunks import DEFAULT_BATCH_ROWS

    return sum(batch.num_rows for file in sorted(Path(run_path, "tokens").glob("part-*.parquet"))
               for batch in pq.ParquetFile(file).iter_batches(batch_size=DEFAULT_BATCH_ROWS, columns=columns))


def method_read(run_path: str) -> int:
    return _read(run_path, REPORT_COLUMNS)


def method_read_analyze(run_path: str) -> int:
    """The bare read of the five columns analyze reads (its own floor; `read` has the report's seven)."""
    return _read(run_path, ANALYZE_COLUMNS)


def method_read_cores(run_path: str) -> int:
    import pyarrow.parquet as pq

    from rcdiag.analysis.passes.chunks import DEFAULT_BATCH_ROWS
    from rcdiag.analysis.passes.threads import ordered_map

    def one(file: Path) -> int:
        return sum(b.num_rows for b in pq.ParquetFile(file).iter_batches(batch_size=DEFAULT_BATCH_ROWS,
                                                                           columns=REPORT_COLUMNS))

    return sum(ordered_map(one, sorted(Path(run_path, "tokens").glob("part-*.parquet"))))


def _passes(run_path: str, threads: int | None) -> int:
    import rcdiag
    from rcdiag.analysis.passes.threads import ordered_map
    from rcdiag.report.options import ReportOptions
    from rcdiag.report.passes import run_passes

    run = rcdiag.open_run(run_path)
    scan, library = run_passes(run, ReportOptions(), lambda fn, items: ordered_map(fn, items, threads=threads))
    if hasattr(library, "finish"):  # the fused engine's library finishes here; the old one in build_report
        from rcdiag.analysis.passes.accum import Totals

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

    def no_gates(*_args: object) -> None:  # report_gates(run, advantages) since the run-wide GRPO groups
        raise InputError("gate sweep left out (benchmark)")

    passes.report_gates = no_gates
    return _passes(run_path, None)


def method_overview(run_path: str) -> int:
    """The dashboard's first Overview of the run (streamlit's AppTest), the pass cache empty (a fresh directory)."""
    import tempfile

    from streamlit.testing.v1 import AppTest

    os.environ["RCDIAG_CACHE_DIR"] = tempfile.mkdtemp(prefix="rcdiag-bench-cache-")
    import rcdiag

    app_file = Path(rcdiag.__file__).resolve().parents[1] / "app" / "dashboard.py"  # the measured tree's app
    sys.argv = [str(app_file), run_path]
    app = AppTest.from_file(str(app_file), default_timeout=1800)
    app.run()
    if app.exception or app.error:
        raise SystemExit(f"overview: {[e.value for e in (*app.exception, *app.error)]}")
    return rcdiag.open_run(run_path).num_tokens


def method_analyze(run_path: str) -> int:
    import rcdiag
    from rcdiag.analysis.metrics.compute import analyze

    metrics, table = analyze(rcdiag.open_run(run_path), modes=MODES, thresholds=(2.0,))
    assert len(table) == 4
    return int(metrics["tokens"])


def _duckdb_row(run_path: str, sql: str) -> tuple:
    import duckdb

    return duckdb.connect().execute(sql.format(glob=f"{run_path}/tokens/*.parquet", c=2.0,
                                               seq_glob=f"{run_path}/sequences/*.parquet")).fetchone()


def method_duckdb(run_path: str) -> int:
    row = _duckdb_row(run_path, DUCKDB_SQL)
    return int(row[DUCKDB_NAMES.index("tokens")])


def method_duckdb_lean(run_path: str) -> int:
    row = _duckdb_row(run_path, DUCKDB_LEAN_SQL)
    assert row[0] == row[0]
    return int(_duckdb_row(run_path, "SELECT count(*) FROM read_parquet('{glob}')")[0])


def check_duckdb(run_path: Path) -> float:
    """The worst relative difference between DuckDB's query and analyze over every number (SystemExit above 1e-8:
    a query that computes other numbers would not be a baseline for these)."""
    import math

    import rcdiag
    from rcdiag.analysis.metrics.compute import analyze

    metrics, table = analyze(rcdiag.open_run(run_path), modes=MODES, thresholds=(2.0,))
    ours = {**metrics, **{f"{r['mode']}.{k}": v for r in table.to_dict(orient="records") for k, v in r.items()}}
    worst, where = 0.0, ""
    for name, theirs in zip(DUCKDB_NAMES, _duckdb_row(str(run_path), DUCKDB_SQL), strict=True):
        mine, theirs = float(ours[name]), float(theirs)
        gap = 0.0 if mine == theirs or (mine == 0 and abs(theirs) < 1e-15) else abs(mine - theirs) / abs(mine)
        if gap > worst or math.isnan(gap):
            worst, where = gap, name
    if not worst <= 1e-8:
        raise SystemExit(f"DuckDB's query is not analyze's numbers: {where} differs by {worst:.3g} relative")
    print(f"DuckDB's query gives analyze's {len(DUCKDB_NAMES)} numbers within {worst:.1e} relative ({where})")
    return worst


def method_report(run_path: str) -> int:
    os.environ["RCDIAG_CACHE_DIR"] = "off"
    import rcdiag
    from rcdiag.report.make import make_report
    from rcdiag.report.options import ReportOptions

    result = make_report([rcdiag.open_run(run_path)], Path(run_path) / "report", ReportOptions())
    return result.reports[0].counts["token_rows"]


METHODS = {"read": method_read, "read-a": method_read_analyze, "read-cores": method_read_cores,
           "passes-1": method_passes_1, "passes": method_passes, "passes-nogates": method_passes_nogates,
           "analyze": method_analyze, "duckdb": method_duckdb, "duckdb-20": method_duckdb_lean, "report": method_report, "overview": method_overview}


ROOT = Path(__file__).resolve().parents[1]
SHARED = ("read", "read-a", "read-cores", "duckdb", "duckdb-20")
"""Methods that run no rcdiag pass (pyarrow, DuckDB): one floor for both trees, measured once per round."""


def _measure(name: str, run_path: str, warm: str | None, repeats: int, where: bool) -> dict[str, Any]:
    """In the child: a warm-up on `warm` (loads the numba cache, imports), then the best wall and best CPU seconds
    of `repeats` runs (a shared machine's neighbours only ever add time); peak RSS from VmHWM (this image's own:
    ru_maxrss would carry the parent's peak across exec). `where`: one more run under the RSS sampler."""
    if warm is not None and name not in SHARED[-1:]:
        METHODS[name](warm)
    best = {"seconds": float("inf"), "cpu": float("inf")}
    for _ in range(repeats):
        start, cpu = time.perf_counter(), time.process_time()
        rows = METHODS[name](run_path)
        best = {"seconds": min(best["seconds"], time.perf_counter() - start),
                "cpu": min(best["cpu"], time.process_time() - cpu)}
    usage = resource.getrusage(resource.RUSAGE_SELF)
    out: dict[str, Any] = {**best, "rows": rows, "rss_mib": peak_rss_mib(), "faults_k": usage.ru_minflt / 1e3}
    if where:
        with RssSampler() as sampler:
            METHODS[name](run_path)
        out["growth"] = sampler.growth
    return out


class RssSampler:
    """Where the resident memory grows: a thread reads /proc/self/statm every 2 ms and, each time RSS passes its
    previous high by ≥ 4 MiB, records the RSS and the innermost rcdiag frames of every thread (the passes run on
    worker threads). Comparing two run sizes' records names the code whose memory grows with the run."""

    STEP = 4 * 2 ** 20

    def __init__(self) -> None:
        self.growth: list[tuple[float, list[str]]] = []
        self._stop = threading.Event()
        self._page = os.sysconf("SC_PAGE_SIZE")

    def _rss(self) -> int:
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * self._page

    def _where(self) -> list[str]:
        me = threading.get_ident()
        found = []
        for ident, frame in sys._current_frames().items():
            if ident == me:
                continue
            chain = []
            while frame is not None and len(chain) < 3:
                name = frame.f_code.co_filename
                if "/rcdiag/" in name or "/app/" in name:
                    chain.append(f"{Path(name).stem}.{frame.f_code.co_name}:{frame.f_lineno}")
                frame = frame.f_back
            if chain:
                found.append(" < ".join(chain))
        return found

    def _loop(self) -> None:
        high = self._rss()
        while not self._stop.wait(0.002):
            rss = self._rss()
            if rss >= high + self.STEP:
                high = rss
                self.growth.append((rss / 2 ** 20, self._where()))

    def __enter__(self) -> RssSampler:
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def peak_rss_mib() -> float:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _env(tree: Path) -> dict[str, str]:
    """The environment that runs `tree`'s rcdiag (PYTHONPATH wins over the venv's editable install)."""
    return {**os.environ, "PYTHONPATH": str(tree), "RCDIAG_CACHE_DIR": "off"}


def measure(name: str, run_path: Path, warm: Path | None, repeats: int, tree: Path = ROOT,
            where: bool = False) -> dict[str, Any]:
    """One method in a fresh interpreter running `tree`'s code (warm-up, best of `repeats`, peak RSS)."""
    command = [sys.executable, __file__, "--child", name, str(run_path), str(warm or ""), str(repeats),
               "1" if where else "0"]
    result = subprocess.run(command, capture_output=True, text=True, env=_env(tree), check=False)
    if result.returncode:
        raise SystemExit(f"{name} ({tree}) failed:\n{result.stderr[-3000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def command_seconds(args: list[str], repeats: int, tree: Path = ROOT) -> float:
    """Best wall seconds of `python -m rcdiag ARGS` run by `tree`'s code (a fresh interpreter each time, as a
    user runs it; the pass cache off)."""
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        subprocess.run([sys.executable, "-m", "rcdiag", *args], check=True, capture_output=True, env=_env(tree))
        best = min(best, time.perf_counter() - start)
    return best


def ensure(path: Path, build: Callable[[], None]) -> Path:
    if not (path / "manifest.json").exists():
        start = time.perf_counter()
        build()
        print(f"built {path} in {time.perf_counter() - start:.1f} s", flush=True)
    return path


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=float, default=2e6, help="token rows of the measured run (default 2e6; "
                        "the issue's sizes: 10e6 and, with --grow, 50e6)")
    parser.add_argument("--grow", type=float, default=0,
                        help="also a run of this many tokens: report/passes time and peak RSS at both sizes, and "
                             "where RSS grows (e.g. --tokens 10e6 --grow 50e6)")
    parser.add_argument("--shard-tokens", type=int, default=1_000_000)
    parser.add_argument("--dir", type=Path, default=Path("/tmp/rcdiag-bench"))
    parser.add_argument("--methods", default=",".join(METHODS), help="comma-separated subset")
    parser.add_argument("--quick", action="store_true", help="one repeat of everything instead of three")
    parser.add_argument("--repeats", type=int, default=3, help="runs of each method (best wall, best CPU)")
    parser.add_argument("--baseline", type=Path, default=None,
                        help="a checkout of an older commit (git worktree add /tmp/base COMMIT): every rcdiag "
                             "method and command also runs its code, alternately with this tree's, in this run")
    parser.add_argument("--runs", type=Path, nargs="*", default=[],
                        help="more run directories to time `rcdiag report` on (the sample run, a real model's)")
    parser.add_argument("--commands", action="store_true",
                        help="time the commands (start-up, --runs, --steps) even when `report` is not a method")
    parser.add_argument("--steps", type=int, default=0, help="also build and time a run of this many steps")
    parser.add_argument("--json", type=Path, default=None, help="also write every figure here")
    parser.add_argument("--print-json", type=Path, default=None, help="print the tables of a saved --json")
    parser.add_argument("--child", nargs=5, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.print_json:
        saved = json.loads(args.print_json.read_text())
        saved.setdefault("load_after", float("nan"))
        labels = {label for by_tree in saved["methods"].values() for label in by_tree} - {"shared"}
        print_results(saved, {label: Path() for label in ("before", "after") if label in labels})
        return
    if args.child:
        name, run, warm, repeats, where = args.child
        print(json.dumps(_measure(name, run, warm or None, int(repeats), where == "1")))
        return
    repeats = 1 if args.quick else args.repeats
    trees = {"after": ROOT} if args.baseline is None else {"before": args.baseline.resolve(), "after": ROOT}
    n = int(args.tokens)
    tiny = ensure(args.dir / "run-2000", lambda: build_run(args.dir / "run-2000", 2_000, args.shard_tokens))
    sizes = {"main": n} if not args.grow else {"main": n, "grow": int(args.grow)}
    paths = {key: ensure(args.dir / f"run-{size}", lambda size=size: build_run(args.dir / f"run-{size}", size,
                                                                               args.shard_tokens))
             for key, size in sizes.items()}
    if args.steps:
        steps = args.dir / f"run-steps-{args.steps}"
        args.runs = [*args.runs, ensure(steps, lambda: build_steps_run(steps, args.steps))]
    if (SAMPLE_RUN / "manifest.json").is_file() and SAMPLE_RUN not in args.runs:
        args.runs = [*args.runs, SAMPLE_RUN]
    methods = [m for m in args.methods.split(",") if m]
    results: dict[str, Any] = {"tokens": n, "cpus": len(os.sched_getaffinity(0)), "load_before": os.getloadavg()[0],
                               "methods": {}, "grow": {}, "commands": {}}
    if "duckdb" in methods:
        results["duckdb_check"] = check_duckdb(paths["main"])
    for name in methods:  # the trees alternate method by method: a neighbour's burst hits both, not one
        for label, tree in (("shared", ROOT),) if name in SHARED else trees.items():
            results["methods"].setdefault(name, {})[label] = measure(
                name, paths["main"], tiny, repeats if name != "overview" else 1, tree)
            save(args.json, results)
    if args.grow:
        for name in ("read", "passes", "report"):
            for label, tree in (("shared", ROOT),) if name in SHARED else trees.items():
                for key in ("main", "grow"):
                    results["grow"].setdefault(name, {}).setdefault(label, {})[key] = measure(
                        name, paths[key], tiny, 1, tree, where=name == "report")
                    save(args.json, results)
    if "report" in methods or args.commands:
        commands = {"report 2,000 tokens": ["report", str(tiny), "--quiet", "--out", str(args.dir / "tiny-report")],
                    "report --help": ["report", "--help"], "--help": ["--help"]}
        commands.update({f"report {extra}": ["report", str(extra), "--quiet", "--out",
                                             str(args.dir / f"{extra.name}-report")] for extra in args.runs})
        for label, argv_ in commands.items():
            for tree_label, tree in trees.items():
                results["commands"].setdefault(label, {})[tree_label] = command_seconds(argv_, repeats, tree)
                save(args.json, results)
    results["load_after"] = os.getloadavg()[0]
    save(args.json, results)
    print_results(results, trees)


def save(path: Path | None, results: dict[str, Any]) -> None:
    """Every figure so far (a long run killed midway keeps what it measured; --print-json reads it back)."""
    if path is not None:
        path.write_text(json.dumps(results, indent=1))


def print_results(results: dict[str, Any], trees: dict[str, Path]) -> None:
    """Every method per tree: wall, CPU, × the bare read (wall and CPU, within the tree's round), peak RSS; then
    the issue's targets as ratios, the growth with the run's size and the commands' wall seconds."""
    m = results["methods"]
    read = m.get("read", {}).get("shared")
    print(f"\n{results['tokens']:,} tokens, {results['cpus']} CPUs, load average {results['load_before']:.1f} → "
          f"{results['load_after']:.1f}; best of the repeats")
    print(f"{'method':<15}{'tree':<8}{'wall s':>8}{'CPU s':>8}{'Mtok/s':>8}{'× read':>8}{'× rd CPU':>9}"
          f"{'RSS MiB':>9}")
    for name, by_tree in m.items():
        for label, r in by_tree.items():
            ratio = r["seconds"] / read["seconds"] if read else float("nan")
            cpu = r["cpu"] / read["cpu"] if read else float("nan")
            print(f"{name:<15}{label:<8}{r['seconds']:>8.2f}{r['cpu']:>8.2f}{r['rows'] / r['seconds'] / 1e6:>8.2f}"
                  f"{ratio:>8.2f}{cpu:>9.2f}{r['rss_mib']:>9.0f}")
    print("\ntargets (ratios within this run):")
    for label in trees:
        def get(name: str, label: str = label) -> float:
            by_tree = m.get(name, {})
            return by_tree.get(label, by_tree.get("shared", {})).get("seconds", float("nan"))

        print(f"  {label:<7} report ≤ 3× read: {get('report') / get('read'):.2f}× (passes {get('passes') / get('read'):.2f}×)"
              f" | analyze ≥ 1.5× DuckDB: {get('duckdb') / get('analyze'):.2f}×"
              f" | analyze ≤ 1.5× its read: {get('analyze') / get('read-a'):.2f}× | first Overview ≤ 5 s: "
              f"{get('overview'):.2f} s")
    for name, by_tree in results["grow"].items():
        for label, r in by_tree.items():
            main_, grow = r["main"], r["grow"]
            print(f"  {label:<7} {name:<7} {main_['rows']:,} → {grow['rows']:,} tokens: {main_['seconds']:.2f} → "
                  f"{grow['seconds']:.2f} s, peak RSS {main_['rss_mib']:.0f} → {grow['rss_mib']:.0f} MiB "
                  f"({grow['rss_mib'] - main_['rss_mib']:+.0f})")
            for key in ("main", "grow"):
                for rss, where in r[key].get("growth", [])[-6:]:  # the last steps up: where the peak is reached
                    print(f"      {key} {rss:7.0f} MiB  {' | '.join(where)[:200]}")
    for label, by_tree in results["commands"].items():
        print(f"  `rcdiag {label}` " + ", ".join(f"{t} {s:.2f} s" for t, s in by_tree.items()))


if __name__ == "__main__":
    main()
