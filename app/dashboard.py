"""Streamlit entry of the rcdiag dashboard: sidebar run chooser and page navigation (pages in app/views/).

Started by `rcdiag dashboard RUN [RUN ...]`, i.e. `streamlit run app/dashboard.py -- RUN [RUN ...]`. The page
scripts live in app/views/, not app/pages/: a `pages/` folder next to the entry switches Streamlit to its older
folder-based multipage mode, in which a rerun executes the page alone and the sidebar (run chooser) vanishes.
"""
from __future__ import annotations

import sys
from pathlib import Path

_ROOT = Path(__file__).resolve().parent.parent
if str(_ROOT) not in sys.path:  # streamlit puts only app/ on the path; `app` is a package of the checkout
    sys.path.insert(0, str(_ROOT))

import streamlit as st  # noqa: E402

from app import heap, ui  # noqa: E402

# (file under app/views/, title, url path), in navigation order. No page icons: Streamlit draws ":material/…:"
# icons with an icon font and an emoji page icon with a remote favicon — the app must not request anything
# off-origin (tests/dashboard/test_offline.py records the browser's requests).
PAGES = (
    ("overview.py", "Overview", "overview"),
    ("distributions.py", "Distributions", "distributions"),
    ("simulator.py", "IS simulator", "simulator"),
    ("sequences.py", "Sequences", "sequences"),
    ("trends.py", "Trends", "trends"),
    ("lag.py", "Policy lag", "lag"),
    ("compare.py", "Compare", "compare"),
    ("probes.py", "Probes", "probes"),
)


def run(argv: list[str] | None = None) -> None:
    """Render the app: `argv` are the run paths given on the command line (default: sys.argv[1:])."""
    given = [str(Path(a).resolve()) for a in (sys.argv[1:] if argv is None else argv) if a]
    st.set_page_config(page_title="rcdiag dashboard", layout="wide")
    ui.sidebar(given)
    pages = [st.Page(Path(__file__).parent / "views" / file, title=title, url_path=url, default=(i == 0))
             for i, (file, title, url) in enumerate(PAGES)]
    st.navigation(pages).run()
    heap.settle()  # after the page's imports: Streamlit's collection after this rerun skips what they made


if __name__ == "__main__":
    run()
