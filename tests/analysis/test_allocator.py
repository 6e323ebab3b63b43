"""The allocator setting the passes make: taken by glibc once per process, and never over a user's own."""
from __future__ import annotations

import os
import platform
import subprocess
import sys

import pytest

CODE = "from rcdiag.analysis.passes.allocator import reuse_batch_memory as r; print(r(), r())"


def _run(**extra: str) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    return subprocess.run([sys.executable, "-c", CODE], capture_output=True, text=True, check=True,
                          env={**env, **extra}).stdout.strip()


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt is glibc's")
def test_glibc_takes_the_thresholds_once():
    assert _run() == "True True"


def test_a_users_own_threshold_is_left_alone():
    assert _run(MALLOC_MMAP_THRESHOLD_="131072") == "False False"
