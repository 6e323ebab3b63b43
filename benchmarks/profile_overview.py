"""Where the first dashboard Overview's time goes besides the pass (issue #32), per stage, after a warm-up.

    python benchmarks/profile_overview.py RUN [--prof out.prof]

The same first Overview as bench_speed.py's `overview` method (streamlit's AppTest of this tree's app/dashboard.py,
an empty pass cache, after a 2,000-token warm-up so that imports and numba's cache loads are not counted); the
functions on its way (STAGES) are wrapped to sum their wall and CPU seconds. CPU is the process's (the pass runs on
a thread per core); app.warm's thread, started as the Overview ends, adds its own calls (distview.view, charts.spec)
until the AppTest returns. `--prof`: also a cProfile of every thread (the page runs on Streamlit's script thread, the pass
on worker threads), written for pstats.
"""
from __future__ import annotations

import argparse
import cProfile
import functools
import importlib
import os
import pstats
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_metrics import build_run  # noqa: E402  (the shared shard-by-shard builder)

ROOT = Path(__file__).resolve().parents[1]
TINY = Path("/tmp/rcdiag-bench/run-2000")
STAGES = (
    ("streamlit.components.v2.manifest_scanner", "scan_component_manifests"),  # AppTest's, once per instance
    ("app.data", "open_ref"), ("app.runcheck", "open_run"), ("app.judged", "judge"),
    ("rcdiag.report.build", "cached_passes"), ("rcdiag.report.cache", "run_passes"),
    ("rcdiag.report.passes", "run_pass"), ("rcdiag.report.cache", "store"), ("rcdiag.report.build", "lag_findings"),
    ("rcdiag.report.build", "report_trend"), ("rcdiag.report.build", "check_findings"),
    ("app.distview", "run_histogram"), ("app.distview", "view"), ("app.charts", "spec"),
)
"""(module, function) pairs timed; a name the tree lacks is skipped (an older checkout)."""


def first_overview(run: Path) -> None:
    """One first Overview of `run` in a fresh AppTest with a fresh, empty pass cache."""
    from streamlit.testing.v1 import AppTest

    os.environ["RCDIAG_CACHE_DIR"] = tempfile.mkdtemp(prefix="rcdiag-profile-cache-")
    app_file = ROOT / "app" / "dashboard.py"
    sys.argv = [str(app_file), str(run)]
    app = AppTest.from_file(str(app_file), default_timeout=1800)
    app.run()
    if app.exception or app.error:
        raise SystemExit(f"overview: {[e.value for e in (*app.exception, *app.error)]}")


def timed(seconds: dict[str, list[float]], name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    """`fn`, adding its wall and process CPU seconds to seconds[name] on every call."""
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        wall, cpu = time.perf_counter(), time.process_time()
        try:
            return fn(*args, **kwargs)
        finally:
            spent = seconds.setdefault(name, [0.0, 0.0])
            spent[0] += time.perf_counter() - wall
            spent[1] += time.process_time() - cpu
    return wrapper


def profiled_threads(profiles: list[cProfile.Profile]) -> None:
    """Every thread started from now on runs under a cProfile of its own, appended to `profiles`."""
    run = threading.Thread.run

    def profiled(self: threading.Thread) -> None:
        profile = cProfile.Profile()
        profiles.append(profile)
        profile.enable()
        try:
            run(self)
        finally:
            profile.disable()
    threading.Thread.run = profiled


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run", type=Path)
    parser.add_argument("--prof", type=Path, default=None, help="also write a cProfile of every thread here")
    args = parser.parse_args()
    if not (TINY / "manifest.json").is_file():
        build_run(TINY, 2_000, 1_000_000)
    first_overview(TINY)  # imports, numba's cache, Streamlit's first run
    seconds: dict[str, list[float]] = {}
    for module, name in STAGES:
        owner = importlib.import_module(module)
        if hasattr(owner, name):
            setattr(owner, name, timed(seconds, f"{module}.{name}", getattr(owner, name)))
    profiles: list[cProfile.Profile] = []
    if args.prof:
        profiled_threads(profiles)
        profiles.append(cProfile.Profile())
        profiles[-1].enable()
    wall, cpu = time.perf_counter(), time.process_time()
    first_overview(args.run)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    if args.prof:
        profiles[-1].disable()
        stats = pstats.Stats(profiles[-1])
        for profile in profiles[:-1]:
            stats.add(profile)
        stats.dump_stats(args.prof)
    print(f"first Overview of {args.run}: {wall:.2f} s wall, {cpu:.2f} s CPU")
    for name, (w, c) in sorted(seconds.items(), key=lambda item: -item[1][0]):
        print(f"  {name:<70}{w:8.3f} s wall{c:8.3f} s CPU")


if __name__ == "__main__":
    main()
