"""The first pass of a fresh install compiles ~50 numba kernels (~20 s) behind a bar at 0 % — or, on a one-file
run, behind nothing at all: a pass that is not silent says so first, once per process, and only when numba's
cache lacks the kernels (an empty NUMBA_CACHE_DIR is a fresh install's cache, for real)."""
from __future__ import annotations

import os
import subprocess
import sys

from rcdiag.analysis.passes import kernels
from rcdiag.report.options import ReportOptions
from rcdiag.report.passes import run_passes
from tests.fixtures.cli import ROOT

_PROBE = """
from rcdiag.analysis.passes import kernels
from rcdiag.analysis.passes.engine import compile_notice
print(kernels.compiled_on_disk())
compile_notice(True)
compile_notice(False)
compile_notice(False)
"""


def test_an_empty_cache_gets_the_notice_once(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "NUMBA_CACHE_DIR": str(tmp_path / "numba")}
    result = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True, env=env, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "False"
    assert result.stderr.count(kernels.FIRST_COMPILE) == 1, result.stderr


def test_after_a_pass_the_cache_holds_the_kernels_and_nothing_is_said(clean_run, capfd):
    run_passes(clean_run, ReportOptions(silent=True))  # compiles (and caches) the kernels if nothing had
    assert kernels.compiled_on_disk()
    run_passes(clean_run, ReportOptions(silent=False))
    assert kernels.FIRST_COMPILE not in capfd.readouterr().err
