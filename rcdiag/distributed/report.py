"""`rcdiag report --ray`: each token file's partial accumulators computed as a Ray task, merged on the driver in
file order — the very merge the local path does (rcdiag.report.passes), so the numbers are identical."""
from __future__ import annotations

import pickle
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

from rcdiag.analysis.passes.engine import FilePart


def ray_map(ray: Any) -> Callable[[Callable[[int], FilePart], Iterable[int]], Iterator[FilePart]]:
    """A `map` that runs each call as a Ray task (all submitted at once) and yields results in input order.
    Results travel pickled: Ray's zero-copy numpy arrays are read-only, and the merge adds into them."""
    remote = ray.remote(max_retries=3)(lambda fn, index: pickle.dumps(fn(index), protocol=5))

    def mapper(fn: Callable[[int], FilePart], indices: Iterable[int]) -> Iterator[FilePart]:
        fn_ref = ray.put(fn)
        refs = [remote.remote(fn_ref, i) for i in indices]
        for ref in refs:
            yield pickle.loads(ray.get(ref))

    return mapper


def make_report_on_ray(runs: Sequence[Any], out: Any, options: Any, ray_address: str) -> Any:
    """rcdiag.report.build.make_report with the per-file passes on the Ray cluster `ray_address` (auto|local|ADDRESS).
    The run directories must be readable from every node (shared or network storage)."""
    from rcdiag.distributed import ray_session
    from rcdiag.report.make import make_report

    with ray_session(ray_address) as ray:
        return make_report(runs, out, options, map_files=ray_map(ray))
