"""cProfile of the report's pass on one thread (issue #32: where its CPU goes), after a 2,000-token warm-up.

    python benchmarks/profile_report.py RUN [--out p.prof] [--top 35]

Run it twice on a fresh tree: the first call in a tree compiles (and caches) the numba kernels a small run
does not reach, which would otherwise dominate the profile."""
from __future__ import annotations

import argparse
import cProfile
import pstats
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_metrics import build_run  # noqa: E402  (the shared shard-by-shard builder)


def main() -> None:
    import rcdiag
    from rcdiag.analysis.passes.accum import Totals
    from rcdiag.analysis.passes.threads import ordered_map
    from rcdiag.report.options import ReportOptions
    from rcdiag.report.passes import run_passes

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run", type=Path)
    parser.add_argument("--out", type=Path, default=Path("report.prof"))
    parser.add_argument("--top", type=int, default=35)
    args = parser.parse_args()
    one_thread = lambda fn, items: ordered_map(fn, items, threads=1)  # noqa: E731
    tiny = Path("/tmp/rcdiag-bench/run-2000")
    if not (tiny / "manifest.json").is_file():
        build_run(tiny, 2_000, 1_000_000)
    run_passes(rcdiag.open_run(tiny), ReportOptions(silent=True), one_thread)
    run = rcdiag.open_run(args.run)
    profile = cProfile.Profile()
    cpu = time.process_time()
    profile.enable()
    _, library = run_passes(run, ReportOptions(silent=True), one_thread)
    library.finish(Totals(library.rows))
    profile.disable()
    print(f"CPU {time.process_time() - cpu:.2f} s")
    profile.dump_stats(args.out)
    pstats.Stats(profile).sort_stats("tottime").print_stats(args.top)


if __name__ == "__main__":
    main()
