"""docs/recipes.md, "Add a dashboard page", followed literally: a view file and one PAGES row give a page that
opens on the sidebar's run and shows the library's verdict (a copy of the app, so the real one is untouched)."""
from __future__ import annotations

import shutil
import sys

from streamlit.testing.v1 import AppTest

from tests.dashboard.conftest import APP
from tests.fixtures.scenarios import build_scenario

TOY = '''"""A toy page (docs/recipes.md)."""
import streamlit as st

from app import judged, ui


def render(ref) -> None:
    report = judged.report(*ref.key)
    st.markdown(f"**{report.verdict.headline()}**")


ui.run_page("Toy", render)
'''


def test_a_page_is_a_view_file_and_one_row(tmp_path, monkeypatch):
    app = tmp_path / "app"
    shutil.copytree(APP.parent, app, ignore=shutil.ignore_patterns("__pycache__"))
    (app / "views" / "toy.py").write_text(TOY)
    dashboard = (app / "dashboard.py").read_text()
    row = '    ("probes.py", "Probes", "probes"),\n'
    assert row in dashboard
    (app / "dashboard.py").write_text(dashboard.replace(row, row + '    ("toy.py", "Toy", "toy"),\n'))
    run = build_scenario(tmp_path / "run", "dense_bf16")
    monkeypatch.setattr(sys, "argv", [str(app / "dashboard.py"), str(run.path)])
    test = AppTest.from_file(str(app / "dashboard.py"), default_timeout=120)
    test.run()
    test.switch_page("views/toy.py").run()
    assert not test.exception and not test.error
    assert any(m.value.startswith("**HEALTHY: numerical mismatch at or below the bfloat16 floor") for m in test.markdown)
    assert any(h.value == "Toy · run" for h in test.header)
