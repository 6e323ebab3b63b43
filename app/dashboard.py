"""Streamlit entry of the rcdiag dashboard: sidebar run chooser and page navigation (pages in app/views/).

Started by `rcdiag dashboard RUN [RUN ...]`, i.e. `streamlit run app/dashboard.py -- RUN [RUN ...]`. The page
scripts live in app/views/, not app/pages/: a `pages/` folder next to the entry switches Streamlit to its older
folder-based multipage mode, in which a rerun executes the page alone and the sidebar (run chooser) vanishes.
"""
from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

_ROOT = Path(__file__).resolve().parent.parent
if str(_ROOT) not in sys.path:  # streamlit puts only app/ on the path; `app` is a package of the checkout
    sys.path.insert(0, str(_ROOT))

import streamlit as st  # noqa: E402

from app import heap, ui  # noqa: E402
from rcdiag.errors import RcdiagError  # noqa: E402
from rcdiag.store.files import MANIFEST_NAME, MAX_MANIFEST_BYTES  # noqa: E402
from rcdiag.store.routes import ROUTING_SECTION  # noqa: E402
from rcdiag.store.safefile import read_json  # noqa: E402

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
    ("routing.py", "Routing", "routing"),
    ("compare.py", "Compare", "compare"),
    ("probes.py", "Probes", "probes"),
)




def routed(path: str | None) -> bool:
    """Whether the run at `path` carries MoE routes (its manifest has a routing section): the Routing page is
    listed only for such runs."""
    try:  # bounded, never a FIFO (rcdiag.store.safefile): this runs on every page of the sidebar's run
        manifest = read_json(Path(path) / MANIFEST_NAME, "manifest", MAX_MANIFEST_BYTES) if path else None
    except RcdiagError:
        return False
    return isinstance(manifest, dict) and isinstance(manifest.get(ROUTING_SECTION), dict)


# Pages listed only when the sidebar's run passes a test (file → predicate of its path). A comment, not a
# docstring: Streamlit's "magic" would write a bare string of this script onto every page.
ONLY_FOR: dict[str, Callable[[str], bool]] = {"routing.py": routed}


def shown(current: str | None, given: list[str]) -> list[tuple[str, str, str]]:
    """The PAGES rows to list for the sidebar's run `current` (a run outside the path policy passes no test)."""
    ok = bool(current) and ui.allowed(current, given)
    return [row for row in PAGES if row[0] not in ONLY_FOR or (ok and ONLY_FOR[row[0]](current))]


def run(argv: list[str] | None = None) -> None:
    """Render the app: `argv` are the run paths given on the command line (default: sys.argv[1:])."""
    given = [str(Path(a).resolve()) for a in (sys.argv[1:] if argv is None else argv) if a]
    st.set_page_config(page_title="rcdiag dashboard", layout="wide")
    ui.sidebar(given)
    rows = shown(st.session_state.get(ui.CURRENT), given)
    pages = [st.Page(Path(__file__).parent / "views" / file, title=title, url_path=url, default=(i == 0))
             for i, (file, title, url) in enumerate(rows)]
    st.navigation(pages).run()
    heap.settle()  # after the page's imports: Streamlit's collection after this rerun skips what they made


if __name__ == "__main__":
    run()
