"""Benchmark: `rcdiag report` on a large run against the bare Parquet read of the same columns.

    python benchmarks/bench_report.py                        # 50 M tokens (run built once, ~1 GB on disk)
    python benchmarks/bench_report.py --tokens 5e6           # quick
    python benchmarks/bench_report.py --tokens 2e6 --keep --dir /tmp/rcdiag-bench

The run comes from benchmarks/bench_metrics.py's shard-by-shard builder (same --dir layout, so a kept run is
reused). Each method runs in a fresh interpreter so peak RSS is its own: (a) rcdiag.report.build.make_report — the
report's streaming scan, the metrics/IS/sweep/rejection pass, the bootstrap, the plots and the files; (c) pyarrow:
read the token columns both passes need, file by file (the floor). (a) also runs on a run 1/5 the size: similar
peak RSS shows that memory does not grow with the run. Prints seconds, tokens/s, a/c and peak RSS.
"""
from __future__ import annotations

import argparse
import multiprocessing
import resource
import shutil
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_metrics import build_run  # noqa: E402  (the shared shard-by-shard builder)

COLUMNS = ["seq_id", "pos", "token_id", "rollout_logprob", "train_logprob", "train_entropy", "mask"]


def method_report(run_path: str, replicates: int) -> int:
    import rcdiag
    from rcdiag.report.make import make_report
    from rcdiag.report.options import ReportOptions

    run = rcdiag.open_run(run_path)
    result = make_report([run], Path(run_path) / "report", ReportOptions(replicates=replicates))
    assert (result.out / "metrics.json").is_file()
    return result.reports[0].counts["token_rows"]


def method_read(run_path: str, replicates: int) -> int:
    """The floor: stream the same columns the report reads, in the same record batches, and do nothing."""
    import rcdiag

    return sum(batch.num_rows for _, batch in rcdiag.open_run(run_path).iter_batches(COLUMNS))


METHODS = {"report": method_report, "read": method_read}


def _measure(name: str, run_path: str, replicates: int) -> dict[str, float]:
    """Runs inside a fresh spawned interpreter: the method's seconds, rows and this process's peak RSS."""
    start, cpu = time.perf_counter(), time.process_time()
    rows = METHODS[name](run_path, replicates)
    return {"seconds": time.perf_counter() - start, "cpu_seconds": time.process_time() - cpu, "rows": rows,
            "rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def measure(name: str, run_path: Path, replicates: int) -> dict[str, float]:
    """One method in its own spawned process (so peak RSS is the method's alone)."""
    with ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn")) as pool:
        return pool.submit(_measure, name, str(run_path), replicates).result()


def ensure_runs(directory: Path, sizes: dict[str, int], shard_tokens: int) -> dict[str, Path]:
    """Build (or reuse) bench_metrics-style runs named run-<tokens> under `directory`."""
    paths = {key: directory / f"run-{n}" for key, n in sizes.items()}
    for key, n in sizes.items():
        if (paths[key] / "manifest.json").exists():
            continue
        start = time.perf_counter()
        build_run(paths[key], n, shard_tokens)
        print(f"built {paths[key]} ({n:,} tokens) in {time.perf_counter() - start:.1f} s", flush=True)
    return paths


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=float, default=50e6, help="token rows of the large run (default 50e6)")
    parser.add_argument("--shard-tokens", type=int, default=1_000_000, help="token rows per Parquet shard")
    parser.add_argument("--replicates", type=int, default=1000, help="bootstrap replicates (default 1000)")
    parser.add_argument("--dir", type=Path, default=Path("/tmp/rcdiag-bench"), help="where the runs are built")
    parser.add_argument("--keep", action="store_true", help="keep (and reuse) the built runs")
    args = parser.parse_args(argv)
    large = int(args.tokens)
    paths = ensure_runs(args.dir, {"large": large, "small": large // 5}, args.shard_tokens)
    results = {"read": measure("read", paths["large"], args.replicates),
               "report": measure("report", paths["large"], args.replicates),
               "report@1/5": measure("report", paths["small"], args.replicates)}
    print_table(results, large)
    if not args.keep:
        shutil.rmtree(args.dir, ignore_errors=True)


def print_table(results: dict[str, dict[str, float]], large: int) -> None:
    print(f"\n{'method':<12}{'rows':>14}{'seconds':>10}{'CPU s':>10}{'Mtok/s':>10}{'peak RSS MiB':>14}")
    for name, r in results.items():
        print(f"{name:<12}{int(r['rows']):>14,}{r['seconds']:>10.2f}{r.get('cpu_seconds', float('nan')):>10.2f}"
              f"{r['rows'] / r['seconds'] / 1e6:>10.2f}{r['rss_mib']:>14.0f}")
    a, c = results["report"]["seconds"], results["read"]["seconds"]
    print(f"\nreport vs bare Parquet read of the same columns: {a / c:.2f}× the read's time (wall)")
    if "cpu_seconds" in results["report"]:
        ratio = results["report"]["cpu_seconds"] / results["read"]["cpu_seconds"]
        print(f"  in CPU time (robust on a shared machine): {ratio:.2f}×")
    print(f"peak RSS of report at {large:,} vs {large // 5:,} tokens: {results['report']['rss_mib']:.0f} vs "
          f"{results['report@1/5']['rss_mib']:.0f} MiB")


if __name__ == "__main__":
    main()
