"""Warm the other pages' caches while the reader looks at the Overview.

The simulator's dense sweep, the Trends page's per-step measurement and the sequence index each need a pass of
their own (the report's pass cannot serve them): computed on the first visit they made that page take 0.5–1.5 s
on a small run, minutes on a large one. After the Overview is drawn, one background thread per run computes them
into the same st.cache_data entries the pages read (Streamlit locks each entry while it is computed: a page
opened meanwhile waits for that result instead of computing it again). It also takes the costs of ~0.1 s each
that a first visit would pay: the Distributions page's charts and the simulator's first chart (specs), the
Sequences page's first sequence and the tokenizer, and the import of pandas' Styler (Compare's table).
"""
from __future__ import annotations

import logging
import threading

from app import data, distview, judged, runcheck, simchart
from app.simvalues import CURVES
from rcdiag.analysis.conventions import DEFAULT_CONVENTION
from rcdiag.analysis.correction.modes import DEFAULT_THRESHOLD, MODES

log = logging.getLogger("rcdiag.dashboard")
logging.getLogger("streamlit.runtime.scriptrunner_utils.script_run_context").setLevel(logging.ERROR)
"""The warming thread has no script context on purpose (no spinner on the page being read): Streamlit's warning
about it, once per cached call, would fill the server log."""
_STARTED: set[tuple[str, str]] = set()
_LOCK = threading.Lock()


def after_overview(path: str, stamp: str) -> None:
    """Start warming the run's pages once per server (a no-op when already started for this file stamp)."""
    with _LOCK:
        if (path, stamp) in _STARTED:
            return
        _STARTED.add((path, stamp))
    threading.Thread(target=_warm, args=(path, stamp), name="rcdiag-warm", daemon=True).start()


def _warm(path: str, stamp: str) -> None:
    """The pages' default views, in the order a reader usually opens them; a failure is left to the page (it
    computes again and shows the message)."""
    try:
        data.sequence_index(path, stamp)
        distview.view(path, stamp, None)
        data.sweep_grid(path, stamp, tuple(MODES), None, DEFAULT_CONVENTION)
        simchart.chart(path, stamp, tuple(MODES), next(iter(MODES)), None, DEFAULT_CONVENTION, CURVES[0],
                       judged.recommended_setting(path, stamp))  # the simulator's first view: its widgets' defaults
        _first_sequence(path, stamp)
        import pandas.io.formats.style  # noqa: F401 - Compare's band-tinted table (pandas' Styler, jinja2: 0.1 s)
        data.trend_frame(path, stamp, DEFAULT_CONVENTION, float(DEFAULT_THRESHOLD))
    except Exception:  # noqa: BLE001 - the page reports it when opened
        log.debug("warming %s stopped", path, exc_info=True)


def _first_sequence(path: str, stamp: str) -> None:
    """What the Sequences page opens with: the first sequence of its default order (data.SORT_KEYS' first,
    descending), its token rows (the first filtered Parquet read also starts pyarrow's dataset machinery, 0.1 s)
    and the run's tokenizer."""
    column = next(iter(data.SORT_KEYS.values()))
    index = data.sequence_index(path, stamp)
    if index.empty or column not in index.columns:
        return
    first = int(index["seq_id"].iloc[int(data.sequence_order(path, stamp, column, True)[0])])
    data.sequence_detail(path, stamp, first)
    data.decode_tokens(runcheck.validate(path, stamp), ())
