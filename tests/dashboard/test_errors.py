"""Bad runs and refused paths are readable messages on every page, never a stack trace."""
from __future__ import annotations

import shutil
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from app import ui
from app.text import plain
from tests.dashboard.conftest import assert_clean
from tests.fixtures.runs import build_run, defect_frames

PAGES = ("overview", "distributions", "simulator", "sequences")


def broken_runs(root: Path) -> dict[str, tuple[Path, str]]:
    """{case: (run directory, text the error must contain)}, each made the way users make them."""
    root.mkdir(parents=True, exist_ok=True)
    cases = {}
    (root / "empty").mkdir()
    cases["not_a_run"] = (root / "empty", "not a run directory")
    corrupt = build_run(root / "corrupt", "clean", seed=1).path
    file = sorted((corrupt / "tokens").glob("part-*.parquet"))[1]
    file.write_bytes(file.read_bytes()[: file.stat().st_size // 2])  # a copy cut short
    cases["corrupt_parquet"] = (corrupt, "unreadable Parquet")
    tokens, sequences = defect_frames("clean", seed=2)
    import rcdiag

    rcdiag.write_run(root / "rollout_only", tokens.drop(columns=["train_logprob", "train_entropy"]), sequences)
    cases["train_logprob_null"] = (root / "rollout_only", "train_logprob is empty")
    dropped = build_run(root / "dropped", "clean", seed=4).path
    for part in (dropped / "tokens").glob("part-*.parquet"):
        table = pq.read_table(part)
        pq.write_table(table.drop_columns(["train_logprob"]), part)
    cases["train_column_missing"] = (dropped, "missing column(s) ['train_logprob']")
    return cases


@pytest.fixture(scope="module")
def broken(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, str]]:
    return broken_runs(tmp_path_factory.mktemp("broken"))


@pytest.mark.parametrize("case", ["not_a_run", "corrupt_parquet", "train_logprob_null", "train_column_missing"])
@pytest.mark.parametrize("page", PAGES)
def test_broken_run_is_a_message(make_app, broken, case, page):
    path, text = broken[case]
    app = make_app(path, page=page)
    assert not app.exception, [e.value for e in app.exception]
    assert len(app.error) == 1 and text in plain(app.error[0].value), [plain(e.value) for e in app.error]
    assert "Traceback" not in plain(app.error[0].value)


def test_corrupt_shard_found_by_metrics_is_a_message(make_app, tmp_path):
    """A shard whose footer is intact but whose data pages are garbage fails inside the library: still a message."""
    run = build_run(tmp_path / "garbled", "clean", seed=6)
    file = sorted((run.path / "tokens").glob("part-*.parquet"))[0]
    data = bytearray(file.read_bytes())
    for i in range(8, len(data) // 2):
        data[i] = (data[i] * 7 + 13) % 256
    file.write_bytes(bytes(data))
    app = make_app(run, page="sequences")
    assert not app.exception
    assert app.error and ("corrupt" in plain(app.error[0].value) or "Parquet" in plain(app.error[0].value)), app.error


def test_path_outside_cwd_and_arguments_is_refused(make_app, noisy_run, tmp_path):
    """Typing a directory that is neither under the working directory nor given on the command line is refused."""
    outside = tmp_path / "elsewhere"
    shutil.copytree(noisy_run.path, outside)
    app = make_app(noisy_run)
    app.selectbox(key="run_choice").set_value(ui.OTHER).run()
    assert "Choose a run directory" in app.info[0].value
    app.text_input(key="run_input").set_value(str(outside)).run()
    assert not app.exception
    assert "Refused" in plain(app.error[0].value) and str(outside) in plain(app.error[0].value)
    app.text_input(key="run_input").set_value(str(noisy_run.path / "tokens" / "..")).run()
    assert_clean(app)  # a path inside a given run is allowed (here: the run itself)


def test_typed_run_under_cwd_opens(make_app, noisy_run, tmp_path, monkeypatch):
    run_dir = tmp_path / "work" / "runs" / "mine"
    shutil.copytree(noisy_run.path, run_dir)
    monkeypatch.chdir(tmp_path / "work")
    app = make_app()
    assert "Choose a run directory" in app.info[0].value
    app.text_input(key="run_input").set_value("runs/mine").run()
    assert_clean(app)
    assert plain(app.header[0].value) == "Overview · mine"


@pytest.mark.parametrize("path,given,ok", [("/a/b/run", ["/a/b/run"], True), ("/a/b/run/x", ["/a/b/run"], True),
                                          ("/a/b/run2", ["/a/b/run"], False), ("/a/b", ["/a/b/run"], False),
                                          ("/w/runs/x", [], True), ("/w/../etc", [], False), ("/w2", [], False)])
def test_allowed(path, given, ok):
    assert ui.allowed(path, given, cwd="/w") is ok


def test_compare_shows_a_bad_run_next_to_good_ones(make_app, noisy_run, clean_dash_run, broken):
    app = make_app(noisy_run, clean_dash_run, broken["corrupt_parquet"][0], page="compare")
    assert not app.exception
    assert len(app.error) == 1 and "unreadable Parquet" in plain(app.error[0].value)
    assert list(app.dataframe[0].value.columns) == ["metric", "noisy", "clean", "Δ clean"]


def test_placeholder_values_show_the_checks_that_explain_them(make_app, tmp_path):
    """NaN rollout log-probs on valid positions: the metrics refuse the run (a message naming file, row and field),
    and the Overview still lists the placeholder check that says where they come from."""
    run = build_run(tmp_path / "nan", "nan_placeholder")
    app = make_app(run)
    assert not app.exception
    assert len(app.error) == 1 and "rollout_logprob" in plain(app.error[0].value) and "row" in plain(app.error[0].value)
    placeholder = [e.label for e in app.expander if "placeholders" in e.label]
    assert placeholder and plain(placeholder[0]).startswith("error")
