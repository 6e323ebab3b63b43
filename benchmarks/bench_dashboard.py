"""Benchmark: dashboard page loads on a large run against the bare Parquet read of the token columns.

    python benchmarks/bench_dashboard.py                     # 3 M tokens (built once under --dir)
    python benchmarks/bench_dashboard.py --tokens 5e5        # quick

The run comes from benchmarks/bench_metrics.py's shard-by-shard builder. Each method runs in a fresh interpreter:
(a) pages: streamlit's AppTest renders Overview, Distributions, IS simulator, Sequences, Compare (cold caches,
shared between pages as in one browser session), then Overview again (warm); (c) read: pyarrow reads the token
columns file by file (the floor). Prints seconds per page, the cold total / read ratio, and peak RSS.
"""
from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(ROOT))
from bench_metrics import build_run  # noqa: E402

APP = ROOT / "app" / "dashboard.py"
PAGES = ("distributions", "simulator", "sequences", "compare")
COLUMNS = ["seq_id", "pos", "token_id", "rollout_logprob", "train_logprob", "train_entropy", "mask"]


def method_pages(run_path: str) -> dict[str, float]:
    from streamlit.testing.v1 import AppTest

    sys.argv = [str(APP), run_path, run_path]
    app = AppTest.from_file(str(APP), default_timeout=1800)
    times = {}
    start = time.perf_counter()
    app.run()
    times["overview"] = time.perf_counter() - start
    for page in PAGES:
        start = time.perf_counter()
        app.switch_page(f"views/{page}.py").run()
        times[page] = time.perf_counter() - start
        if app.exception or app.error:
            raise SystemExit(f"{page}: {[e.value for e in (*app.exception, *app.error)]}")
    start = time.perf_counter()
    app.switch_page("views/overview.py").run()
    times["overview_warm"] = time.perf_counter() - start
    return times


def method_read(run_path: str) -> dict[str, float]:
    import pyarrow.parquet as pq

    start = time.perf_counter()
    for file in sorted(Path(run_path, "tokens").glob("part-*.parquet")):
        pq.read_table(file, columns=COLUMNS)
    return {"read": time.perf_counter() - start}


METHODS = {"pages": method_pages, "read": method_read}


def run_method(name: str, run_path: Path) -> dict[str, float]:
    command = [sys.executable, __file__, "--method", name, "--run", str(run_path)]
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    if result.returncode:
        raise SystemExit(f"{name} failed:\n{result.stderr[-3000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tokens", type=float, default=3e6)
    parser.add_argument("--dir", type=Path, default=ROOT / "bench_data" / "dashboard")
    parser.add_argument("--method", choices=METHODS)
    parser.add_argument("--run", type=Path)
    args = parser.parse_args()
    if args.method:
        out = METHODS[args.method](str(args.run))
        out["peak_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        print(json.dumps(out))
        return
    run = args.dir / f"run_{int(args.tokens)}"
    if not (run / "manifest.json").is_file():
        start = time.perf_counter()
        build_run(run, int(args.tokens), shard_tokens=1_000_000)
        print(f"built {run} in {time.perf_counter() - start:.1f} s")
    read = run_method("read", run)
    pages = run_method("pages", run)
    cold = sum(v for k, v in pages.items() if k not in ("overview_warm", "peak_rss_mib"))
    print(f"run: {run} ({int(args.tokens):,} tokens)")
    for name, value in pages.items():
        print(f"  {name:<16} {value:8.2f}" + (" MiB" if name == "peak_rss_mib" else " s"))
    print(f"  read (floor)     {read['read']:8.2f} s   peak RSS {read['peak_rss_mib']:.0f} MiB")
    print(f"  all pages cold / read = {cold / read['read']:.1f}×; overview warm {pages['overview_warm']:.2f} s")


if __name__ == "__main__":
    main()
