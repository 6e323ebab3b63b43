"""An async run with mixed lags, from true log-softmax values: the engine samples with version v (its logits
perturbed as a bf16 engine's would be), the trainer scores at version v + lag, the policy drifting with each
version. Also returns the trainer's log-probs at the generating version (what `score --checkpoint` measures),
for the exact split."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from rcdiag.record import Recorder

VOCAB = 64


def async_run(path: Path, *, steps: int = 4, batch: int = 24, drift: float = 0.6, engine_noise: float = 0.05,
              seed: int = 0, versions: bool = True, trainer_version: bool = True) -> dict[int, np.ndarray]:
    """Write the run through rcdiag.Recorder; returns {seq_id: trainer log-probs at the generating version}."""
    rng = np.random.default_rng(seed)
    base = torch.from_numpy(rng.standard_normal((VOCAB,)) * 2.5)
    directions = torch.from_numpy(rng.standard_normal((steps + 3, VOCAB)))
    recorder = Recorder(path, version_is_step=trainer_version)
    generating: dict[int, np.ndarray] = {}
    seq = 0
    for step in range(steps):
        lags = rng.choice([0, 0, 1, 2], batch)
        ids, train, engine, gen = [], [], [], []
        for lag in lags:
            n = int(rng.integers(4, 16))
            context = torch.from_numpy(rng.standard_normal((n, VOCAB)))
            version = step - int(lag)
            z_gen = base + context + drift * directions[version + 2]
            z_train = base + context + drift * directions[step + 2]
            z_engine = z_gen + torch.from_numpy(rng.standard_normal((n, VOCAB))) * engine_noise
            tok = torch.multinomial(torch.softmax(z_engine, -1), 1, generator=torch.Generator().manual_seed(seq))
            def pick(z: torch.Tensor, tok: torch.Tensor = tok) -> np.ndarray:
                return torch.log_softmax(z, -1).gather(1, tok).squeeze(1).float().numpy()

            ids.append(tok.squeeze(1).numpy())
            train.append(pick(z_train))
            engine.append(pick(z_engine))
            gen.append(pick(z_gen))
            generating[seq] = gen[-1]
            seq += 1
        recorder.add(step, [[1, 2, 3]] * batch, ids, engine, train,
                     version=(step - lags).tolist() if versions else None,
                     trainer_version=None)
    return generating
