"""The three runs of the verdict tests: healthy dense-like, heavy-tailed MoE-like, and a temperature bug."""
from __future__ import annotations

from pathlib import Path

import numpy as np

import rcdiag
from rcdiag.store.run import Run
from tests.fixtures.runs import SyntheticSpec, build_run, defect_manifest, synthetic_frames

TAIL_SHARE = 0.019
"""Share of valid tokens given a ratio above 2 in the MoE-like run (the issue's 1.9 %)."""
WORST_LOG_RATIO = 6.0
"""The worst token: the top of the published MoE range (R3: 2–6 nats), so the tail stays a correctable numerical one;
beyond 15 nats the verdict calls it not numerics (tests/report/test_scenarios.py)."""


def heavy_tailed_run(path: str | Path, seed: int = 3, share: float = TAIL_SHARE) -> Run:
    """A clean dense-like run whose tail is made MoE-like: `share` of the valid tokens get
    ℓ ~ U(0.8, 3) nats (ratio 2.2 … 20, the rollout log-prob lowered), one of them ℓ = 6 (χ² and k3 large)."""
    tokens, sequences = synthetic_frames(SyntheticSpec(n_seq=160, seed=seed))
    rng = np.random.default_rng(seed)
    valid = np.flatnonzero(tokens["mask"].to_numpy())
    hit = rng.choice(valid, size=round(share * valid.size), replace=False)
    lift = rng.uniform(0.8, 3.0, size=hit.size)
    lift[0] = WORST_LOG_RATIO
    train = tokens["train_logprob"].to_numpy(dtype=np.float64)
    rollout = tokens["rollout_logprob"].to_numpy(dtype=np.float64).copy()
    rollout[hit] = train[hit] - lift
    tokens["rollout_logprob"] = rollout.astype(np.float32)
    return rcdiag.write_run(path, tokens, sequences, manifest=defect_manifest("clean"), shard_tokens=1500,
                            overwrite=True)


def verdict_runs(root: Path) -> dict[str, Run]:
    return {"healthy": build_run(root / "healthy", "clean", n_seq=120),
            "heavy": heavy_tailed_run(root / "heavy"),
            "temperature": build_run(root / "temperature", "temperature")}
