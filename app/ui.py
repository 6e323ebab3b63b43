"""Shared dashboard pieces: the sidebar run chooser (with its path policy), the page guard, metric cards."""
from __future__ import annotations

import html
import logging
import os
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import streamlit as st

from app import bands, data, state
from app.text import md
from rcdiag.errors import RcdiagError
from rcdiag.numbers import fmt  # the one formatter; views call ui.fmt
from rcdiag.store.names import unique_run_names

GIVEN = "rcdiag_given_runs"
CURRENT = "rcdiag_current_run"
OPENED = "rcdiag_opened_runs"
OTHER = "other directory…"
log = logging.getLogger("rcdiag.dashboard")


def allowed(path: str | Path, given: list[str], cwd: str | Path | None = None) -> bool:
    """True when `path` resolves inside the working directory or inside a run given on the command line."""
    try:
        resolved = Path(path).expanduser().resolve()
    except (OSError, RuntimeError):  # a symlink loop: not a place the dashboard may read
        return False
    roots = [Path(cwd or os.getcwd()).resolve(), *(Path(g).resolve() for g in given)]
    return any(resolved == root or root in resolved.parents for root in roots)


def sidebar(given: list[str]) -> None:
    """The run chooser: the runs given on the command line, or a typed directory (checked against `allowed`)."""
    st.session_state[GIVEN] = given
    st.sidebar.title("rcdiag")
    options = [*given, OTHER]
    _run_from_url(given)
    names = run_names(given)
    choice = st.sidebar.selectbox("Run", options, key="run_choice", format_func=lambda p: names.get(p, p)) \
        if given else OTHER
    if choice == OTHER:
        typed = st.sidebar.text_input("Run directory", key="run_input", placeholder="runs/sample",
                                      help="A run directory under the working directory or given on the command line.")
        choice = typed.strip()
    st.session_state[CURRENT] = choice or None
    state.publish("run", names.get(choice, choice) or None)
    if choice:
        st.sidebar.caption(md(choice))


def _run_from_url(given: list[str]) -> None:
    """On a session's first run, open the URL's `run` (a given run's name, else a typed directory)."""
    if st.session_state.get("_url_run_seen"):
        return
    st.session_state["_url_run_seen"] = True
    raw = st.query_params.get("run")
    if not raw:
        return
    by_name = {name: path for path, name in run_names(given).items()}
    if raw in by_name or raw in given:
        st.session_state["run_choice"] = by_name.get(raw, raw)
    else:
        st.session_state["run_choice"] = OTHER
        st.session_state["run_input"] = raw


def run_names(paths: list[str]) -> dict[str, str]:
    """Each run path's display and URL name: the same unique names as the report (store.names.unique_run_names),
    so two runs both called `run` read `run-exp1` and `run-exp2`, in the sidebar, in Compare and in links."""
    return dict(zip(paths, unique_run_names(paths), strict=True))


def current_run() -> data.RunRef | None:
    """The run chosen in the sidebar, validated; shows why and returns None when there is none to show."""
    choice = st.session_state.get(CURRENT)
    if not choice:
        st.info("Choose a run directory in the sidebar (a directory written by `rcdiag score` or `rcdiag import`).")
        return None
    return open_allowed(choice)


def open_allowed(path: str) -> data.RunRef | None:
    """Open `path` if the path policy allows it (else an error message and None); remembers it for Compare."""
    given = st.session_state.get(GIVEN, [])
    if not allowed(path, given):
        st.error(f"Refused: {md(path)} is outside the working directory ({md(os.getcwd())}) and is not one of the "
                 f"runs given on the command line. Start rcdiag dashboard {md(path)} to open it.")
        return None
    ref = data.open_ref(path)
    opened = st.session_state.setdefault(OPENED, [])
    if ref.path not in opened:
        opened.append(ref.path)
    return ref


def run_page(title: str, render: Callable[[data.RunRef], None]) -> None:
    """A page about the sidebar's run: its header, then `render(ref)`, guarded; a hint when no run is chosen."""
    def page() -> None:
        ref = current_run()
        if ref is not None:
            st.header(f"{title} · {md(ref.name)}")
            render(ref)
    guarded(page)


def guarded(render: Callable[[], None]) -> None:
    """Run a page; rcdiag and Parquet errors become a readable message on the page, never a stack trace."""
    try:
        render()
    except RcdiagError as exc:  # messages quote the run's data (paths, values): shown as text
        st.error(md(exc))
    except (pa.ArrowException, OSError) as exc:
        st.error(f"Could not read the run's files: {md(exc)}. The run may be corrupt — re-create it.")
    except Exception as exc:  # a bug: say so plainly, keep the traceback for the server log
        log.exception("dashboard page failed")
        st.error(f"Internal error ({type(exc).__name__}: {md(exc)}). Please report it with the run's manifest.")


def card(label: str, value: float | None, status: str, help_text: str = "") -> str:
    """HTML of one metric card coloured by its band status (bands.COLOURS)."""
    colour = bands.COLOURS[status]
    shown = fmt(value)
    return (f'<div class="rcdiag-card" title="{html.escape(help_text)}" style="border-left:6px solid {colour};'
            f'padding:6px 10px;margin:4px 0;background:#fafafa;border-radius:4px">'
            f'<div style="font-size:0.8em;color:#555">{html.escape(label)}</div>'
            f'<div style="font-size:1.4em;font-weight:600">{shown}</div>'
            f'<div style="font-size:0.75em;color:{colour};font-weight:600">{status}</div></div>')
