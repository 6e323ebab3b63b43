"""app.heap: Streamlit's collection after every rerun must not traverse the imported modules' objects again.

Each check runs in a fresh interpreter: freezing is process-wide, and the test process's own heap (pytest, every
other test's imports) would say nothing about the dashboard's.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.dashboard.conftest import APP

ROOT = Path(__file__).resolve().parents[2]


def _python(code: str) -> dict:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=ROOT, check=True,
                         timeout=300)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_settle_freezes_only_after_new_imports():
    """A freeze per rerun would keep every rerun's cyclic garbage forever; none after a page's first imports would
    leave those modules' objects to every later collection. settle freezes exactly when sys.modules grew."""
    got = _python("""
import gc, json
import pandas
from app import heap
first = heap.settle(); frozen = gc.get_freeze_count()
junk = [{"i": i} for i in range(1000)]
again = heap.settle(); unchanged = gc.get_freeze_count() == frozen
import colorsys  # a module not imported before
after_import = heap.settle()
print(json.dumps({"first": first, "frozen": frozen, "again": again, "unchanged": unchanged,
                  "after_import": after_import, "grew": gc.get_freeze_count() > frozen}))
""")
    assert got["first"] and got["frozen"] > 50_000, got  # pandas alone: ~80k objects
    assert not got["again"] and got["unchanged"], got
    assert got["after_import"] and got["grew"], got


def test_dashboard_rerun_leaves_the_modules_to_the_permanent_generation():
    """The bug: Streamlit's gc.collect(2) after every rerun walked ~250k objects of streamlit, pandas, pyarrow and
    rcdiag (80-170 ms per rerun, most of a control's server time). After the dashboard has shown every page, what
    a full collection still traverses is a small fraction of what is frozen."""
    got = _python(f"""
import gc, json, logging, sys
logging.disable(logging.WARNING)
from streamlit.testing.v1 import AppTest
from tests.fixtures.runs import build_run
import tempfile
run = build_run(tempfile.mkdtemp() + "/run", "clean", seed=5)
sys.argv = [{str(APP)!r}, str(run.path)]
app = AppTest.from_file({str(APP)!r}, default_timeout=120)
app.run()
for page in ("distributions", "simulator", "sequences", "compare", "probes", "trends"):
    app.switch_page(f"views/{{page}}.py").run()
    assert not app.exception, [e.value for e in app.exception]
gc.collect()
print(json.dumps({{"frozen": gc.get_freeze_count(), "tracked": len(gc.get_objects()),
                   "altair": "altair" in sys.modules}}))
""")
    assert got["frozen"] > 100_000, got
    assert got["tracked"] < got["frozen"] / 5, got
    assert not got["altair"], "a page imported Altair (0.2 s and ~30k objects; the charts are Vega-Lite JSON)"
