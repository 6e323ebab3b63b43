"""Benchmark: `rcdiag report` over a large multi-file run, local (one process) vs --ray with 2 workers.

    python benchmarks/bench_ray_report.py                      # 8 M tokens in 1 M-row files (~2-4 min on 2 cores)
    python benchmarks/bench_ray_report.py --tokens 2e6 --shard-tokens 250000

Builds the run with benchmarks/bench_metrics.build_run, then, in one process: the local report
(rcdiag.report.build.build_report: per-file partials with the builtin map, merged in file order) and the same report
with the per-file partials as Ray tasks on a local 2-CPU cluster (cluster start-up is timed apart), each twice,
keeping the faster. Checks the two reports are identical and prints wall seconds, tokens/s and the ratio
local/ray (> 1: Ray faster). On a shared machine the ratio is what matters, not the absolute times.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_metrics import build_run  # noqa: E402


def _timed(fn: object, repeats: int) -> tuple[float, object]:
    best, result = float("inf"), None
    for _ in range(repeats):
        start = time.perf_counter()
        result = fn()
        best = min(best, time.perf_counter() - start)
    return best, result


def _snapshot(report: object) -> str:
    names = ("metrics", "intervals", "tails", "strata", "is_modes", "rejection", "worst_tokens")
    return json.dumps({n: getattr(report, n) for n in names}, sort_keys=True, default=repr)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=float, default=8e6, help="token rows (default 8e6)")
    parser.add_argument("--shard-tokens", type=int, default=1_000_000, help="token rows per Parquet file")
    parser.add_argument("--workers", type=int, default=2, help="Ray CPUs (default 2)")
    parser.add_argument("--replicates", type=int, default=200, help="bootstrap replicates (default 200)")
    parser.add_argument("--repeats", type=int, default=2, help="timings per method, the best is kept")
    parser.add_argument("--dir", type=Path, default=Path("/tmp/rcdiag-bench-ray"), help="where the run is built")
    args = parser.parse_args(argv)

    import ray

    from rcdiag.distributed.report import ray_map
    from rcdiag.report.build import build_report
    from rcdiag.report.options import ReportOptions
    from rcdiag.store.run import open_run

    path = args.dir / f"run-{int(args.tokens)}-{args.shard_tokens}"
    if not (path / "manifest.json").exists():
        print(f"building {int(args.tokens):,} tokens in {path} …", flush=True)
        build_run(path, int(args.tokens), args.shard_tokens)
    run = open_run(path)
    options = ReportOptions(replicates=args.replicates)
    local_s, local = _timed(lambda: build_report(run, options), args.repeats)
    start = time.perf_counter()
    ray.init(num_cpus=args.workers, include_dashboard=False, log_to_driver=False, configure_logging=False)
    startup_s = time.perf_counter() - start
    try:
        ray_s, remote = _timed(lambda: build_report(run, options, map_files=ray_map(ray)), args.repeats)
    finally:
        ray.shutdown()
    same = _snapshot(local) == _snapshot(remote)
    tokens = run.num_tokens
    print(f"run: {tokens:,} token rows, {len(run.token_files)} files, {run.num_sequences:,} sequences")
    print(f"{'method':<22}{'wall s':>10}{'Mtok/s':>10}")
    print(f"{'local (1 process)':<22}{local_s:>10.2f}{tokens / local_s / 1e6:>10.2f}")
    print(f"{f'ray ({args.workers} workers)':<22}{ray_s:>10.2f}{tokens / ray_s / 1e6:>10.2f}")
    print(f"ratio local/ray: {local_s / ray_s:.2f}   (ray start-up {startup_s:.1f} s, not included)")
    print(f"reports identical: {same}")
    if not same:
        raise SystemExit("the Ray report differs from the local one")


if __name__ == "__main__":
    main()
