"""Multi-step runs shared by the trend tests (built once per session: a drifting one and a flat one)."""
from __future__ import annotations

import pytest

from tests.trend.steps import noise_schedule, write_step_run

CHANGE = 6
"""The step from which the drifting run's mismatch grows."""
STEPS = 10


@pytest.fixture(scope="session")
def drifting_run(tmp_path_factory):
    return write_step_run(tmp_path_factory.mktemp("trend") / "drifting", noise_schedule(STEPS, CHANGE))


@pytest.fixture(scope="session")
def flat_run(tmp_path_factory):
    return write_step_run(tmp_path_factory.mktemp("trend") / "flat", noise_schedule(STEPS, None), seed=3)
