"""Start Streamlit for the dashboard (`python app/serve.py run app/dashboard.py …`, what `rcdiag dashboard` runs),
serving Streamlit's own front end with one line added to its index.html.

A page opened by its URL (a pasted link, a reload on /simulator) made the front end look for its server at
/simulator/_stcore/health and /simulator/_stcore/host-config before falling back to the root: two 404s in the
browser console per deep link (12 over the 7 pages). The added line tells the front end its backend is the origin's
root (`window.__streamlit.BACKEND_BASE_URL`, a setting Streamlit's front end reads at start), so it asks there
first. Everything else is served as installed: the other files are symlinks into Streamlit's static folder.
"""
from __future__ import annotations

import atexit
import shutil
import sys
import tempfile
from pathlib import Path

CONFIG = ("<script>window.__streamlit = Object.assign({}, window.__streamlit, "
          "{BACKEND_BASE_URL: window.location.origin + \"/\"})</script>")
"""Inserted before Streamlit's first script: the backend is this page's origin, at its root."""


def static_mirror(source: Path, target: Path) -> Path:
    """`target` made a copy of Streamlit's static folder `source`: symlinks to every entry but index.html, which
    is written with CONFIG in its <head>. ValueError when index.html has no <head> to put it in."""
    index = (source / "index.html").read_text(encoding="utf-8")
    if "<head>" not in index:
        raise ValueError(f"{source / 'index.html'} has no <head>")
    target.mkdir(parents=True, exist_ok=True)
    for entry in source.iterdir():
        if entry.name != "index.html":
            (target / entry.name).symlink_to(entry)
    (target / "index.html").write_text(index.replace("<head>", "<head>\n    " + CONFIG, 1), encoding="utf-8")
    return target


def main(argv: list[str]) -> None:
    from streamlit import file_util
    from streamlit.web import cli

    mirror = Path(tempfile.mkdtemp(prefix="rcdiag-static-"))
    atexit.register(shutil.rmtree, mirror, True)
    try:
        static_mirror(Path(file_util.get_static_dir()), mirror)
    except (OSError, ValueError):  # an unexpected Streamlit layout: serve it as installed (the probes' 404s return)
        pass
    else:
        file_util.get_static_dir = lambda: str(mirror)
    sys.argv = ["streamlit", *argv]
    cli.main()


if __name__ == "__main__":
    main(sys.argv[1:])
