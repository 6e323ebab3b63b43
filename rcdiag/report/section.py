"""One report section's interface: the blocks it adds, the figures it wants drawn, the metrics.json keys it adds.

Every section builder (rcdiag.report.sections.SECTIONS) takes a RunReport and returns a Section or None.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from rcdiag.report.figproc import FigureSpec
from rcdiag.report.render import Block


@dataclass(frozen=True)
class Section:
    """`blocks` in reading order; `figures` {PNG file name: figure spec} for the figure process; `data` the keys it
    adds to metrics.json."""

    blocks: list[Block]
    figures: dict[str, FigureSpec] = field(default_factory=dict)
    data: dict[str, Any] = field(default_factory=dict)
