"""The view's state in the URL (`st.query_params`), so that a reload or a pasted link reopens the same view.

A widget bound with `bind(key, name, parse)` takes its first value from the URL's `name` parameter (when the
parameter parses and the widget has no value yet), and `publish(name, value)` writes the current value back after
the widget is drawn. Parameters: run, runs (Compare; joined by ','), seq, sort, desc, page (Sequences), mode,
convention, threshold, lower (IS simulator), convention, threshold, step (Trends); the page itself is the URL
path.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import streamlit as st


def bind(key: str, name: str, parse: Callable[[str], Any], allowed: Callable[[Any], bool] = lambda v: True) -> bool:
    """Seed session_state[key] from the URL parameter `name` once per session (ignored when absent, unparsable or
    not allowed); True when it did."""
    seeded = f"_url_seeded_{key}"
    if st.session_state.get(seeded):
        return False
    st.session_state[seeded] = True
    raw = st.query_params.get(name)
    if raw is None or key in st.session_state:
        return False
    try:
        value = parse(raw)
    except (TypeError, ValueError):
        return False
    if not allowed(value):
        return False
    st.session_state[key] = value
    return True


def publish(name: str, value: Any) -> None:
    """Write `value` to the URL parameter `name` (None removes it); unchanged values are not rewritten."""
    text = None if value is None else (",".join(map(str, value)) if isinstance(value, (list, tuple)) else str(value))
    if st.query_params.get(name) == text:
        return
    if text is None:
        st.query_params.pop(name, None)
    else:
        st.query_params[name] = text


def as_bool(raw: str) -> bool:
    if raw.lower() in ("1", "true", "yes"):
        return True
    if raw.lower() in ("0", "false", "no"):
        return False
    raise ValueError(raw)
