"""Deprecated alias: the sample data's reward function moved to rcdiag.score.sample (`rcdiag.sample.reward`
still works)."""
from __future__ import annotations

from rcdiag.score.sample import reward

__all__ = ["reward"]
