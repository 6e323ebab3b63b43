"""`rcdiag probe --sample N` before vs after, in one run: wall and CPU seconds, vLLM engine starts, trainer model
loads, and whether the per-token results are the same bit for bit.

    python benchmarks/bench_probe.py RUN --baseline /tmp/base   # /tmp/base: `git worktree add /tmp/base 829959a`

The two trees may run different grids (since the quick CPU grid, the default probes fewer settings): the
per-token columns both have are compared bit for bit.

Both sides run the real CLI as subprocesses (PYTHONPATH = the baseline tree, then this tree) on the same run;
engine starts and trainer loads are counted from the probe's own "engine: building" / "trainer: loading" lines.
CPU time (the children's user + system) is the figure to trust on a shared machine; the load average is printed.
"""
from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pyarrow.parquet as pq

HERE = Path(__file__).resolve().parents[1]
ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": "2",
       "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}


def probe(tree: Path, run: str, sample: int, name: str) -> dict[str, float]:
    """Run `rcdiag probe` from `tree`; seconds, CPU seconds, engine starts, trainer loads."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "rcdiag", "probe", str(Path(run).resolve()), "--sample",
                           str(sample), "--name", name], env={**os.environ, **ENV, "PYTHONPATH": str(tree)},
                          capture_output=True, text=True, cwd=tempfile.gettempdir())  # `-m` puts cwd first
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode:
        sys.exit(f"{tree}: rcdiag probe failed ({done.returncode}):\n{done.stderr[-3000:]}")
    text = done.stdout + done.stderr
    return {"seconds": wall, "cpu": (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime),
            "engines": text.count("engine: building"), "loads": text.count("trainer: loading")}


def _bytes(table: pq.lib.Table, column: str) -> bytes:
    """A column's values as raw bytes (bit for bit: -0.0 ≠ 0.0, NaN payloads count)."""
    return table.column(column).to_numpy(zero_copy_only=False).tobytes()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run", help="a run directory with a local engine model (e.g. from `make demo`)")
    parser.add_argument("--baseline", required=True, type=Path, help="a checkout of the baseline commit")
    parser.add_argument("--sample", type=int, default=8)
    args = parser.parse_args()
    print(f"load average at start: {os.getloadavg()[0]:.2f} ({os.cpu_count()} cores)")
    rows = {"before": probe(args.baseline, args.run, args.sample, "bench_before"),
            "after": probe(HERE, args.run, args.sample, "bench_after")}
    print(f"load average at end:   {os.getloadavg()[0]:.2f}")
    print(f"{'':8}{'wall s':>8}{'CPU s':>8}{'engines':>9}{'loads':>7}")
    for label, row in rows.items():
        print(f"{label:8}{row['seconds']:8.1f}{row['cpu']:8.1f}{row['engines']:9d}{row['loads']:7d}")
    print(f"after/before: wall {rows['after']['seconds'] / rows['before']['seconds']:.2f}×, "
          f"CPU {rows['after']['cpu'] / rows['before']['cpu']:.2f}×  (target: ≤ 90 s wall)")
    probes = Path(args.run) / "probes"
    before, after = (pq.read_table(probes / f"bench_{k}.parquet") for k in ("before", "after"))
    common = [c for c in before.column_names if c in after.column_names]
    same = all(_bytes(before, c) == _bytes(after, c) for c in common)
    print(f"settings: before {len(before.column_names) - 5}, after {len(after.column_names) - 5} (the quick grid "
          f"on CPU); only before: {sorted(set(before.column_names) - set(after.column_names))}; only after: "
          f"{sorted(set(after.column_names) - set(before.column_names))}")
    print(f"per-token results of the shared settings bit for bit equal: {same}  ({after.num_rows} rows × "
          f"{len(common)} columns)")
    if not same:
        for column in common:
            if _bytes(before, column) != _bytes(after, column):
                print(f"  differs: {column}")
        sys.exit(1)


if __name__ == "__main__":
    main()
