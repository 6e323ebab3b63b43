"""Which numbers of metrics.json moved between two trees, and by how much (issue #32: ulp-level changes are allowed
but must be said).

    python benchmarks/moved_bits.py RUN --baseline /work/wt/bench-old        # this tree vs the checkout
    python benchmarks/moved_bits.py RUN --baseline OLD --show 40              # more of the moved numbers

Runs `rcdiag report RUN --quiet` from each tree (PYTHONPATH, the pass cache off, same options) and compares every
number both metrics.json files have at the same place: equal bits, or moved by a relative difference |new − old| /
max(|old|, tiny), also in units of the old value's ulp. Numbers only one side has (a section added since) are
counted, not compared. Prints per top-level section: compared, moved, the largest relative move and where.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def report_json(run: Path, tree: Path, out: Path, extra: list[str]) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": str(tree), "RCDIAG_CACHE_DIR": "off"}
    # cwd away from any checkout: `python -m` puts the working directory before PYTHONPATH, so run from a tree
    # both sides would import that tree's rcdiag (and compare it with itself)
    subprocess.run([sys.executable, "-m", "rcdiag", "report", str(run.resolve()), "--quiet", "--out",
                    str(out.resolve()), *extra], check=True, capture_output=True, env=env, cwd=tempfile.gettempdir())
    return json.loads((out / "metrics.json").read_text())


def leaves(value: Any, where: str = "") -> dict[str, float]:
    """Every float leaf by its path (ints and bools are counts and flags: compared too, as floats)."""
    if isinstance(value, dict):
        return {p: v for k, item in value.items() for p, v in leaves(item, f"{where}.{k}").items()}
    if isinstance(value, list):
        return {p: v for i, item in enumerate(value) for p, v in leaves(item, f"{where}[{i}]").items()}
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return {where: float(value)}
    return {}


def moved(old: float, new: float) -> tuple[float, float] | None:
    """(relative move, ulps of old) or None when the bits are equal (NaN = NaN)."""
    if old == new or (math.isnan(old) and math.isnan(new)):
        return None
    if not (math.isfinite(old) and math.isfinite(new)):
        return math.inf, math.inf
    return abs(new - old) / max(abs(old), 1e-300), abs(new - old) / math.ulp(old) if old else math.inf


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run", type=Path)
    parser.add_argument("--baseline", type=Path, required=True, help="a checkout of the older commit")
    parser.add_argument("--show", type=int, default=12, help="moved numbers listed, largest first")
    parser.add_argument("--skip", default="manifest,run,context,options,bootstrap",
                        help="top-level sections not compared (settings and provenance, not numbers)")
    args, extra = parser.parse_known_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        old = leaves(report_json(args.run, args.baseline.resolve(), Path(tmp) / "old", extra))
        new = leaves(report_json(args.run, ROOT, Path(tmp) / "new", extra))
    skip = tuple(f".{s}" for s in args.skip.split(","))
    shared = sorted(p for p in set(old) & set(new) if not p.startswith(skip))
    sections: dict[str, list[int]] = {}
    changes = []
    for path in shared:
        section = path.split(".")[1].split("[")[0]
        count = sections.setdefault(section, [0, 0])
        count[0] += 1
        m = moved(old[path], new[path])
        if m is not None:
            count[1] += 1
            changes.append((m[0], m[1], path, old[path], new[path]))
    print(f"{args.run}: {len(shared)} numbers at the same place in both metrics.json; only old "
          f"{len(set(old) - set(new))}, only new {len(set(new) - set(old))}")
    for section, (compared, count) in sections.items():
        worst = max((c for c in changes if c[2].split(".")[1].split("[")[0] == section), default=None)
        tail = f", largest {worst[0]:.2g} relative ({worst[1]:.3g} ulp) at {worst[2]}" if worst else ""
        print(f"  {section:<22} {compared:>5} compared, {count:>4} moved{tail}")
    for rel, ulps, path, a, b in sorted(changes, reverse=True)[:args.show]:
        print(f"    {rel:9.2g} rel {ulps:9.3g} ulp  {path}: {a!r} → {b!r}")


if __name__ == "__main__":
    main()
