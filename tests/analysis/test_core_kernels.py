"""Issue #32's analyze kernels, bit for bit against the kernels they stand in for: the lean per-sequence table
(kernels.sequence_core vs sequence_table's rows), the register-held second pass of a few token modes (vs each mode
alone, which takes the mode-by-mode loop) and the fused token modes + core columns (is_kernels.token_modes_core)."""
from __future__ import annotations

import math

import numpy as np
import pytest

from rcdiag.analysis.correction import is_kernels
from rcdiag.analysis.passes import kernels


def _chunk(seed: int, scale: float, dtype: type = np.float32) -> tuple[np.ndarray, ...]:
    """a, b, kept, ℓ̂, expm1(ℓ̂), ρ̂ and starts of 80 sequences: heavy-tailed ℓ (scale 0.01: mostly quiet rows),
    rows at ±20+, at the bounds and at ±log 2, 20 % not kept and one sequence without a kept row — the row terms
    computed as chunks.TokenChunk.terms computes them."""
    rng = np.random.default_rng(seed)
    lengths = rng.choice([1, 2, 7, 8, 9, 127, 128, 300], 80)
    starts = np.concatenate(([0], np.cumsum(lengths)[:-1])).astype(np.int64)
    n = int(lengths.sum())
    b = (-rng.exponential(1.5, n)).astype(dtype)
    ell = scale * rng.standard_t(2, n)
    ell[rng.integers(0, n, 30)] = rng.choice([25.0, -25.0, math.log(2.0), -math.log(2.0), math.log(1.5)], 30)
    a = (b + ell).astype(dtype)
    kept = rng.random(n) > 0.2
    kept[starts[3]:starts[4]] = False
    _, lh = kernels.clamped_log_ratio(a, b, kept, 20.0)
    em1 = np.expm1(lh)
    return a, b, kept, lh, em1, kernels.ratio_rows(lh, em1), starts


def _params(n_modes: int, swift: bool) -> np.ndarray:
    modes = [(c, low, action) for action in (0.0, 1.0) for c, low in ((2.0, None), (1.5, 0.5), (5.0, None))]
    return np.array([[c, low or 0.0, math.log(c), math.log(low) if low else -math.inf,
                      math.log(low) if low else -math.log(c), action] for c, low, action in modes[:n_modes]])


def _bits(x: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(x).view(np.uint64)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_sequence_core_is_the_tables_rows(dtype):
    a, b, kept, lh, em1, rho, starts = _chunk(1, 1.0, dtype)
    full = kernels.sequence_table(a, b, kept, lh, em1, rho, starts, 2.0, 0.0)
    rows = [kernels.COLUMN[name] for name in kernels.CORE_COLUMNS]
    assert np.array_equal(_bits(kernels.sequence_core(a, b, kept, lh, em1, starts)), _bits(full[rows]))


@pytest.mark.parametrize("swift", [False, True])
@pytest.mark.parametrize("n_modes", [2, 3, 4, 5])
@pytest.mark.parametrize("scale", [0.01, 1.0])
def test_few_modes_equal_each_mode_alone_and_the_fused_core(swift, n_modes, scale):
    """2–4 modes on a mostly quiet chunk take the shared-sum path with the register-held second pass (5: the
    one-visit loop); each mode's outputs are the bits of its own single-mode call (the mode-by-mode loop), and
    token_modes_core gives token_modes' outputs and, on the quiet chunk, sequence_core's columns, bit for bit
    (scale 1: a loud chunk takes the mode-by-mode loop and gives no columns)."""
    a, b, kept, lh, em1, rho, starts = _chunk(2, scale)
    params = _params(n_modes, swift)
    together = is_kernels.token_modes(lh, rho, kept, starts, params, swift, False)
    for j in range(n_modes):
        alone = is_kernels.token_modes(lh, rho, kept, starts, params[j:j + 1], swift, False)
        for joint, single in zip(together[:3], alone[:3], strict=True):
            assert np.array_equal(_bits(joint[j:j + 1]), _bits(single))
    *fused, core = is_kernels.token_modes_core(a, b, kept, lh, em1, rho, starts, params, swift)
    for got, want in zip(fused, together[:3], strict=True):
        assert np.array_equal(_bits(got), _bits(want))
    if scale < 1.0:  # mostly quiet: the shared-sum path, which sums the core columns too
        assert np.array_equal(_bits(core), _bits(kernels.sequence_core(a, b, kept, lh, em1, starts)))
    else:  # the mode-by-mode loop: no columns (the chunk computes them on demand)
        assert core.shape == (0, 0)
