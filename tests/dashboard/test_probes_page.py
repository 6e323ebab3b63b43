"""The Probes page shows a probe file's text as text and survives an empty grid (issue #34 item 6): notes were
rendered as Markdown, so an image link in a probe JSON loaded from a remote host in every viewer's browser; a probe
with an empty `settings` list was a page traceback (KeyError)."""
from __future__ import annotations

import json
import shutil

from app.text import md
from tests.dashboard.conftest import assert_clean

PIXEL = "![pixel](http://probe.invalid/p.png) **bold**"


def test_probe_notes_are_text_and_an_empty_grid_is_said(make_app, clean_dash_run, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(clean_dash_run.path, run)
    (run / "probes").mkdir(exist_ok=True)
    (run / "probes" / "empty.json").write_text(json.dumps({
        "gap": {"mean_abs": 0.01, "k3_kl": 1e-4}, "sample": {"sequences": "<img src=x>", "valid_tokens": 10},
        "temperature": 1.0, "budget": [], "settings": [], "notes": [PIXEL]}))
    app = make_app(run, page="probes")
    assert_clean(app)
    infos = [i.value for i in app.info]
    assert md(PIXEL) in infos, infos
    assert not any("](http" in text for text in infos)
    assert any("holds no settings" in text for text in infos), infos
    assert not [e.value for e in app.error], [e.value for e in app.error]


def test_probe_file_that_is_a_fifo_or_a_huge_integer_is_an_error_on_the_page(make_app, clean_dash_run, tmp_path):
    """A FIFO named probes/x.json blocked the page forever; a 5,000-digit integer was an internal error."""
    import os

    for name, make in (("fifo", lambda f: os.mkfifo(f)), ("digits", lambda f: f.write_text('{"gap": ' + "9" * 5000 +
                                                                                            "}"))):
        run = tmp_path / name
        shutil.copytree(clean_dash_run.path, run)
        (run / "probes").mkdir(exist_ok=True)
        make(run / "probes" / "p.json")
        app = make_app(run, page="probes")
        errors = [e.value for e in app.error]
        assert any("Could not read the probe" in e for e in errors), errors
        assert not any("Internal error" in e for e in errors), errors
