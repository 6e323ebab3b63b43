"""The one run-naming rule: unique, readable, and safe as a directory name."""
from __future__ import annotations

import pytest

from rcdiag.store.names import MAX_NAME, safe_name, unique_run_names


@pytest.mark.parametrize(("name", "safe"), [
    ("run", "run"), ("..", "run"), (".", "run"), ("", "run"), (".hidden", "hidden"), ("a/b", "a_b"),
    ("..\\..\\etc", "_.._etc"), ("-rf", "rf"), ("my run (v2)", "my_run_v2_"), ("qwen2.5-7b+tis", "qwen2.5-7b+tis"),
    ("ölmodell", "ölmodell"), ("x" * 300, "x" * MAX_NAME)])
def test_safe_name(name, safe):
    assert safe_name(name) == safe
    assert "/" not in safe and "\\" not in safe and not safe.startswith(".")


def test_unique_names_tell_same_named_runs_by_parent():
    paths = ["exp1/run", "exp2/run", "other", "exp3/RUN"]
    assert unique_run_names(paths) == ["run-exp1", "run-exp2", "other", "RUN-exp3"]


def test_unique_names_fall_back_to_a_counter():
    assert unique_run_names(["a/run", "a/run", "a/run"]) == ["run-a", "run-a-2", "run-a-3"]
    assert unique_run_names(["x/a", "y/b", "z/run"], ["..", "..", "run"]) == ["run-x", "run-y", "run-z"]
    names = unique_run_names(["p/Run", "q/run-2", "p/run"], ["Run", "run-2", "run"])
    assert len({n.casefold() for n in names}) == 3
