"""Benchmark: all metrics + the four IS modes from a Parquet run — rcdiag vs a pandas baseline vs the bare read.

    python benchmarks/bench_metrics.py                       # 50 M tokens (builds the run once, ~1 GB on disk)
    python benchmarks/bench_metrics.py --tokens 5_000_000    # quick
    python benchmarks/bench_metrics.py --tokens 2e6 --keep --dir /tmp/rcdiag-bench

Builds the run shard by shard with RunWriter (never the whole table in memory), then measures, each in a fresh
subprocess so that peak RSS is per method (imports and rcdiag's kernel loading are set-up, reported apart):
(a) rcdiag.analysis.metrics.compute.analyze (every docs/metrics.md metric and the four IS modes at one threshold, one streaming pass);
(b) pandas: load all token files, then groupby; (c) pyarrow: read the needed columns file by file and drop them
(the floor). (a) also runs on a run of 1/5 the size: a flat peak RSS shows
that memory does not grow with the data. Prints tokens/s, the ratios b/a (speed-up) and a/c, and peak RSS.
"""
from __future__ import annotations

import argparse
import json
import math
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa

COLUMNS = ["seq_id", "pos", "rollout_logprob", "train_logprob", "mask"]


# ------------------------------------------------------------------------------------------------ build
def build_run(path: Path, n_tokens: int, shard_tokens: int, seed: int = 0) -> None:
    """A synthetic run of ≈ n_tokens token rows: lengths 1…1000, ℓ ~ N(0, 0.02²) plus rare outliers, 2 % masked."""
    from rcdiag.store.manifest import new_manifest
    from rcdiag.store.schema import TOKEN_SCHEMA
    from rcdiag.store.writer import RunWriter, prepare_sequences

    rng = np.random.default_rng(seed)
    writer = RunWriter(path, {"bench": n_tokens, "seed": seed}, overwrite=True)
    written, next_seq, index = 0, 0, 0
    while written < n_tokens:
        lengths = rng.integers(1, 1001, size=max(1, shard_tokens // 500))
        lengths = lengths[np.cumsum(lengths) <= max(n_tokens - written, lengths[0])] if written + \
            lengths.sum() > n_tokens else lengths
        n = int(lengths.sum())
        seq = np.repeat(np.arange(next_seq, next_seq + lengths.size, dtype=np.int64), lengths)
        pos = (np.arange(n) - np.repeat(np.cumsum(lengths) - lengths, lengths)).astype(np.int32)
        b = -rng.exponential(1.5, n)
        ell = rng.normal(0.0, 0.02, n) + np.where(rng.random(n) < 1e-3, rng.normal(0.0, 3.0, n), 0.0)
        table = pa.table({
            "seq_id": seq, "pos": pos, "token_id": rng.integers(0, 50_000, n, dtype=np.int32),
            "rollout_logprob": b.astype(np.float32), "train_logprob": (b + ell).astype(np.float32),
            "train_entropy": rng.random(n, dtype=np.float32), "mask": rng.random(n) >= 0.02}, schema=TOKEN_SCHEMA)
        writer.write_shard(index, table, prepare_sequences(None, table))
        written, next_seq, index = written + n, next_seq + lengths.size, index + 1
    writer.finish(new_manifest("bench"))


# ------------------------------------------------------------------------------------------------ methods
def method_rcdiag(run_path: str, threshold: float) -> int:
    import rcdiag
    from rcdiag.analysis.metrics.compute import analyze

    run = rcdiag.open_run(run_path)
    metrics, table = analyze(run, modes=("token_truncate", "token_mask", "sequence_truncate", "sequence_mask"),
                             thresholds=(threshold,))
    assert len(table) == 4 and math.isfinite(metrics["kl"])
    return int(metrics["tokens"])


def method_pandas(run_path: str, threshold: float) -> int:
    """What one writes by hand: load every token file into one DataFrame, then vectorised pandas + groupby."""
    import pandas as pd

    files = sorted(Path(run_path, "tokens").glob("part-*.parquet"))
    df = pd.concat([pd.read_parquet(f, columns=COLUMNS) for f in files], ignore_index=True)
    df = df[df["mask"]]
    a, b = df["train_logprob"].astype("float64"), df["rollout_logprob"].astype("float64")
    ell = a - b
    lh = ell.clip(-20, 20)
    rho = np.exp(lh)
    out = {"kl": float((-ell).mean()), "k3_kl": float((rho - lh - 1).mean()), "chi2_token": float((rho ** 2).mean() - 1)}
    frame = pd.DataFrame({"seq_id": df["seq_id"], "a": a, "b": b, "ell": ell, "rho": rho})
    g = frame.groupby("seq_id")
    seq = g[["a", "b", "ell"]].mean()
    out.update(training_log_ppl=float((-seq["a"]).mean()), training_ppl=float(np.exp(-seq["a"]).mean()),
               rollout_log_ppl=float((-seq["b"]).mean()), rollout_ppl=float(np.exp(-seq["b"]).mean()),
               log_ppl_diff=float((-seq["ell"]).mean()), log_ppl_abs_diff=float(seq["ell"].abs().mean()),
               ppl_ratio=float(np.exp(-seq["ell"]).mean()),
               chi2_seq=float((np.exp(2 * seq["ell"].clip(-20, 20)) - 1).mean()))
    seq_ratio = np.exp(seq["ell"].clip(-20, 20))
    token_seq_ratio = frame["seq_id"].map(seq_ratio)
    weights = {"token_truncate": rho.clip(upper=threshold), "token_mask": rho.where(rho <= threshold, 0.0),
               "sequence_truncate": token_seq_ratio.clip(upper=threshold),
               "sequence_mask": token_seq_ratio.where(token_seq_ratio <= threshold, 0.0)}
    for name, w in weights.items():
        mean = w.mean()
        out[name] = {"mean": mean, "std": w.std(ddof=0), "min": w.min(), "max": w.max(),
                     "ess": mean ** 2 / (w ** 2).mean(), "high": float((rho > threshold).mean()),
                     "low": float((rho < 1 / threshold).mean()),
                     "kept_seq": float((w.groupby(frame["seq_id"]).max() > 0).mean())}
    return int(len(df))


def method_pyarrow(run_path: str, threshold: float) -> int:
    import pyarrow.parquet as pq

    rows = 0
    for file in sorted(Path(run_path, "tokens").glob("part-*.parquet")):
        table = pq.read_table(file, columns=COLUMNS)
        rows += table.num_rows
        del table
    return rows


METHODS = {"rcdiag": method_rcdiag, "pandas": method_pandas, "pyarrow": method_pyarrow}


def run_method(name: str, run_path: Path, threshold: float) -> dict[str, float]:
    """Run one method in a fresh interpreter; returns seconds, rows and peak RSS (MiB) of that process."""
    command = [sys.executable, __file__, "--method", name, "--run", str(run_path), "--threshold", str(threshold)]
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    if result.returncode:
        raise SystemExit(f"{name} failed:\n{result.stderr[-3000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def _child(name: str, run_path: str, threshold: float) -> None:
    import pandas  # noqa: F401  (imports are set-up, not measured: every method needs pandas/pyarrow)
    import pyarrow.parquet  # noqa: F401

    import rcdiag.analysis.correction.modes  # noqa: F401
    import rcdiag.analysis.metrics.compute  # noqa: F401

    jit = time.process_time()
    if name == "rcdiag":
        _load_kernels()
    jit = time.process_time() - jit
    start, cpu = time.perf_counter(), time.process_time()
    rows = METHODS[name](run_path, threshold)
    seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
    rss = _peak_rss_mib()
    print(json.dumps({"seconds": seconds, "cpu": cpu, "rows": rows, "rss_mib": rss, "jit_cpu": jit}))


def _load_kernels() -> None:
    """Load rcdiag's compiled kernels (numba's on-disk cache) for the run's column types: a fixed once-per-process
    cost like the imports, reported apart (`jit_cpu`) rather than spread over the tokens/s."""
    import pandas as pd

    from rcdiag.analysis.metrics.compute import analyze

    frame = pd.DataFrame({"seq_id": np.array([0, 0, 1], dtype=np.int64), "pos": np.array([0, 1, 0], dtype=np.int32),
                          "rollout_logprob": np.full(3, -1.0, np.float32),
                          "train_logprob": np.full(3, -1.1, np.float32), "mask": np.ones(3, bool)})
    analyze(frame, modes=("token_truncate", "token_mask", "sequence_truncate", "sequence_mask"), thresholds=(2.0,))


def _peak_rss_mib() -> float:
    """Peak RSS of this process image: VmHWM (reset by exec, unlike ru_maxrss, which a child inherits from the
    forked parent)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


# ------------------------------------------------------------------------------------------------ main
def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=float, default=50e6, help="token rows of the large run (default 50e6)")
    parser.add_argument("--shard-tokens", type=int, default=1_000_000, help="token rows per Parquet shard")
    parser.add_argument("--threshold", type=float, default=2.0, help="IS threshold C (default 2.0)")
    parser.add_argument("--dir", type=Path, default=Path("/tmp/rcdiag-bench"), help="where the runs are built")
    parser.add_argument("--keep", action="store_true", help="keep (and reuse) the built runs")
    parser.add_argument("--pandas-run", choices=("large", "small", "none"), default="large",
                        help="run the pandas baseline (it holds every row in memory, ~200 B/token) on the large "
                             "run, on the 1/5 run (compare tokens/s), or not at all")
    parser.add_argument("--method", choices=sorted(METHODS), help=argparse.SUPPRESS)
    parser.add_argument("--run", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.method:
        _child(args.method, args.run, args.threshold)
        return
    large, small = int(args.tokens), int(args.tokens) // 5
    paths = {"large": args.dir / f"run-{large}", "small": args.dir / f"run-{small}"}
    for key, n in (("large", large), ("small", small)):
        if not (paths[key] / "manifest.json").exists():
            start = time.perf_counter()
            build_run(paths[key], n, args.shard_tokens)
            print(f"built {paths[key]} ({n:,} tokens) in {time.perf_counter() - start:.1f} s", flush=True)
    results = {"rcdiag": run_method("rcdiag", paths["large"], args.threshold),
               "pyarrow": run_method("pyarrow", paths["large"], args.threshold),
               "rcdiag@1/5": run_method("rcdiag", paths["small"], args.threshold)}
    if args.pandas_run != "none":
        results["pandas"] = run_method("pandas", paths[args.pandas_run], args.threshold)
    report(results, large)
    if not args.keep:
        shutil.rmtree(args.dir, ignore_errors=True)


def report(results: dict[str, dict[str, float]], large: int) -> None:
    print(f"\n{'method':<14}{'rows':>14}{'wall s':>9}{'cpu s':>9}{'Mtok/s wall':>13}{'Mtok/s cpu':>12}"
          f"{'peak RSS MiB':>14}")
    for name, r in results.items():
        print(f"{name:<14}{int(r['rows']):>14,}{r['seconds']:>9.2f}{r['cpu']:>9.2f}"
              f"{r['rows'] / r['seconds'] / 1e6:>13.2f}{r['rows'] / r['cpu'] / 1e6:>12.2f}{r['rss_mib']:>14.0f}")
    for clock in ("seconds", "cpu"):
        rate = {name: r["rows"] / r[clock] for name, r in results.items()}  # tokens/s: size-independent ratios
        label = "wall" if clock == "seconds" else "cpu"
        print(f"\n[{label}] rcdiag time / pyarrow read time (a/c): {rate['pyarrow'] / rate['rcdiag']:.2f} "
              "(target ≤ 2)")
        if "pandas" in rate:
            print(f"[{label}] rcdiag throughput / pandas throughput (a vs b): {rate['rcdiag'] / rate['pandas']:.1f}× "
                  "(target ≥ 10)")
    print(f"peak RSS of rcdiag at {large:,} vs {large // 5:,} tokens: {results['rcdiag']['rss_mib']:.0f} vs "
          f"{results['rcdiag@1/5']['rss_mib']:.0f} MiB")
    print(f"rcdiag once per process, not in the figures above: loading the compiled kernels "
          f"{results['rcdiag']['jit_cpu']:.2f} s cpu (first use after install also compiles them, once)")


if __name__ == "__main__":
    main()
