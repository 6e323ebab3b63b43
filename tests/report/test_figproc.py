"""The figure process: a real child interpreter draws the report's figures with the same bytes as the report's own
process, and every way it can fail falls back to drawing in the parent."""
from __future__ import annotations

import os
import signal

import pytest

from rcdiag import cli
from rcdiag.report import figproc
from rcdiag.report.build import build_report
from rcdiag.report.make import make_report
from rcdiag.report.options import ReportOptions
from rcdiag.report.sections import figure_specs

FAST = ReportOptions(replicates=100)


@pytest.fixture(scope="module")
def specs(synthetic_runs):
    return figure_specs(build_report(synthetic_runs["clean"], FAST))


@pytest.fixture
def child():
    process = figproc.FigureProcess()
    yield process
    process.close()


def test_child_draws_the_parents_bytes(specs, child):
    first, second = child.request(specs), child.request({"again.png": specs["sweep.png"]})
    later = child.answer(second)  # answers are read in order: the first is kept for its own caller
    answer = child.answer(first)
    assert answer is not None and later is not None, "the child did not answer"
    assert answer == figproc.draw(specs)
    assert later == {"again.png": answer["sweep.png"]}
    assert all(png[:8] == b"\x89PNG\r\n\x1a\n" for png in answer.values())


def test_a_dead_child_makes_the_parent_draw(specs, child, monkeypatch):
    child.child.kill()
    child.child.wait()
    monkeypatch.setattr(figproc, "_PROCESS", child)
    assert figproc.submit(specs)() == figproc.draw(specs)
    assert not child.alive
    assert figproc.submit(specs)() == figproc.draw(specs)  # later requests skip the child


def test_a_hung_child_is_given_up(specs, child, monkeypatch):
    os.kill(child.child.pid, signal.SIGSTOP)  # alive but never answering
    monkeypatch.setattr(figproc, "ANSWER_TIMEOUT", 0.5)
    monkeypatch.setattr(figproc, "_PROCESS", child)
    assert figproc.submit(specs)() == figproc.draw(specs)
    assert not child.alive and child.child.poll() is not None  # killed, not left stopped


def test_a_failing_figure_raises_in_the_parent(child, monkeypatch):
    bad = {"bad.png": ("by_stratum", ("not rows", "title"))}  # a missing argument: TypeError when drawn
    ticket = child.request(bad)
    assert child.answer(ticket) is None and child.alive  # the child says it failed and goes on serving
    monkeypatch.setattr(figproc, "_PROCESS", child)
    with pytest.raises(TypeError):
        figproc.submit(bad)()


def test_unpicklable_request_is_drawn_in_the_parent(child, monkeypatch):
    monkeypatch.setattr(figproc, "_PROCESS", child)
    spec = {"x.png": ("log_ratio_histogram", (lambda: None,))}  # a lambda does not pickle
    assert child.request(spec) is None and not child.alive
    with pytest.raises(AttributeError):  # drawn here: the real error of the real call
        figproc.submit(spec)()


def test_frames_round_trip_and_refuse_garbage():
    images = {"a.png": b"\x89PNG data", "ℓ.png": b"", "b.png": bytes(range(256))}
    body = figproc.encode(images)
    assert figproc.decode(body) == images
    for broken in (body[:-1], body + b"x", b"\xff" * 8):
        with pytest.raises(ValueError):
            figproc.decode(broken)


def test_report_files_do_not_depend_on_the_process(synthetic_runs, tmp_path, monkeypatch):
    outs, drawn_here = {}, []
    local = figproc.draw
    monkeypatch.setattr(figproc, "draw", lambda specs: drawn_here.append(set(specs)) or local(specs))
    for switch in ("1", "0"):
        monkeypatch.setenv(figproc.ENV_SWITCH, switch)
        out = make_report([synthetic_runs["clean"]], tmp_path / switch, FAST).out
        outs[switch] = {p.name: p.read_bytes() for p in out.glob("*.png")}
        assert bool(drawn_here) == (switch == "0"), "the child draws when on, the parent when switched off"
    assert len(outs["1"]) == 4 and outs["1"] == outs["0"]


def test_only_a_report_that_runs_starts_it(synthetic_runs, tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(figproc, "prestart", lambda: calls.append(1))
    assert cli.main(["report", "--help"]) == 0 and not calls
    assert cli.main(["dashboard", "--help"]) == 0 and not calls
    assert cli.main(["report", str(synthetic_runs["clean"].path), "--quiet", "--out", str(tmp_path / "r")]) == 0
    assert calls


def test_scan_figures_go_out_before_the_report_is_finished(synthetic_runs, tmp_path, monkeypatch):
    """The figures of the passes' own numbers are sent the moment the run is judged, before the bootstrap, worst
    items and recommendation, and only the sweep after them: each figure is requested once."""
    from rcdiag.report import make

    events = []
    request = figproc.FigureProcess.request
    monkeypatch.setattr(figproc.FigureProcess, "request",
                        lambda self, specs: events.append(sorted(specs)) or request(self, specs))
    finish = make.finish_report
    monkeypatch.setattr(make, "finish_report", lambda *args: events.append("finish") or finish(*args))
    monkeypatch.setenv(figproc.ENV_SWITCH, "1")
    make_report([synthetic_runs["clean"]], tmp_path / "r", FAST)
    assert events == [["l_by_position.png", "l_histogram.png", "l_vs_rollout.png"], "finish", ["sweep.png"]]
