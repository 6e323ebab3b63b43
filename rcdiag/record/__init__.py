"""Recording from inside a trainer: `Recorder` (the library API), and hooks for TRL (`rcdiag.record.trl`) and verl
(`rcdiag.record.verl`) built on it. Imports neither trainer: each hook takes the trainer's own objects."""
from __future__ import annotations

from rcdiag.record.recorder import Recorder, RecorderOptions

__all__ = ["Recorder", "RecorderOptions"]
