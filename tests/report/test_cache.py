"""The per-run cache of the report passes: same numbers from disk, never stale, optional, outside the run."""
from __future__ import annotations

import os
import stat

import pytest

import rcdiag
from rcdiag.analysis.passes.accum import Totals
from rcdiag.report import cache
from rcdiag.report.options import ReportOptions
from rcdiag.report.passes import run_passes
from tests.fixtures.runs import SyntheticSpec, synthetic_frames


@pytest.fixture
def cache_home(tmp_path, monkeypatch):
    directory = tmp_path / "cache"
    monkeypatch.setenv(cache.CACHE_ENV, str(directory))
    return directory


def _run(path, noise=0.3, seed=1):
    tokens, sequences = synthetic_frames(SyntheticSpec(noise=noise, n_seq=30, seed=seed))
    return rcdiag.write_run(path, tokens, sequences, shard_tokens=400, overwrite=True)


def _numbers(result):
    scan, library = result
    numbers = library.finish(Totals(library.rows))
    gates = numbers.pop("gates")
    gates = None if gates is None else gates.astype(object).where(gates.notna(), "NaN").to_dict("list")
    return (numbers, gates, scan.tails.finish(),
            scan.strata.finish(), scan.sums.table()[1].tolist())


def test_hit_gives_the_same_numbers_as_a_fresh_pass(tmp_path, cache_home):
    run, options = _run(tmp_path / "run"), ReportOptions()
    assert not cache.is_cached(run, options)
    first = cache.cached_passes(run, options)
    assert cache.is_cached(run, options) and list((cache_home / "passes").glob("*.pkl"))
    again = cache.cached_passes(rcdiag.open_run(run.path), options)
    assert again is not first
    assert _numbers(again) == _numbers(first) == _numbers(run_passes(run, options))


def test_rewritten_run_is_never_served_stale(tmp_path, cache_home):
    options = ReportOptions()
    run = _run(tmp_path / "run", noise=0.3, seed=1)
    before = _numbers(cache.cached_passes(run, options))
    rewritten = _run(tmp_path / "run", noise=0.9, seed=2)  # same path, new bytes
    after = _numbers(cache.cached_passes(rewritten, options))
    assert after != before
    assert after == _numbers(run_passes(rewritten, options))


def test_in_place_rewrite_with_same_size_and_mtime_is_detected(tmp_path, cache_home):
    """Same size, same mtime (restored), same inode: the footer hash still changes the key."""
    run, options = _run(tmp_path / "run"), ReportOptions()
    key = cache.cache_key(run, options)
    file = run.token_files[0]
    st = file.stat()
    other = _run(tmp_path / "other", noise=0.9, seed=2).token_files[0].read_bytes()
    data = (other + b"\0" * st.st_size)[:st.st_size]
    with file.open("r+b") as handle:
        handle.write(data)
    os.utime(file, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert cache.cache_key(run, options) != key


def test_options_that_change_the_passes_change_the_key(tmp_path, cache_home):
    run = _run(tmp_path / "run")
    keys = {cache.cache_key(run, o) for o in (ReportOptions(), ReportOptions(threshold=3.0),
                                              ReportOptions(convention="verl"), ReportOptions(lower=0.5))}
    assert len(keys) == 4
    assert cache.cache_key(run, ReportOptions(replicates=50)) == cache.cache_key(run, ReportOptions())


def test_read_only_run_and_unusable_cache(tmp_path, monkeypatch):
    run, options = _run(tmp_path / "run"), ReportOptions()
    before = sorted(p.name for p in run.path.rglob("*"))
    for path in [run.path, *run.path.rglob("*")]:
        path.chmod(path.stat().st_mode & ~(stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH))
    try:
        blocker = tmp_path / "not-a-dir"
        blocker.write_text("x")
        monkeypatch.setenv(cache.CACHE_ENV, str(blocker))  # mkdir fails: no cache, same numbers
        assert _numbers(cache.cached_passes(run, options)) == _numbers(run_passes(run, options))
        monkeypatch.setenv(cache.CACHE_ENV, "off")
        assert cache.cache_path(run, options) is None and not cache.is_cached(run, options)
        assert _numbers(cache.cached_passes(run, options)) == _numbers(run_passes(run, options))
    finally:
        for path in [run.path, *run.path.rglob("*")]:
            path.chmod(path.stat().st_mode | stat.S_IWUSR)
    assert sorted(p.name for p in run.path.rglob("*")) == before  # nothing written into the run


def test_corrupt_entry_is_recomputed(tmp_path, cache_home):
    run, options = _run(tmp_path / "run"), ReportOptions()
    cache.cached_passes(run, options)
    path = cache.cache_path(run, options)
    path.write_bytes(b"truncated")
    assert _numbers(cache.cached_passes(run, options)) == _numbers(run_passes(run, options))
    assert cache.load(run, options) is not None
    assert cache.clear_cache() == 1 and not cache.is_cached(run, options)


def test_an_entry_others_may_write_is_never_unpickled(tmp_path, cache_home):
    """Pickles run code when loaded: an entry (or its directory) writable by group/others — a planted file in a
    shared cache directory — is ignored and recomputed, never loaded."""
    run, options = _run(tmp_path / "run"), ReportOptions()
    cache.cached_passes(run, options)
    entry = cache.cache_path(run, options)
    assert cache.load(run, options) is not None
    entry.write_bytes(b"cos\nsystem\n(S'touch " + str(tmp_path / "pwned").encode() + b"'\ntR.")
    entry.chmod(entry.stat().st_mode | stat.S_IWOTH)
    assert cache.load(run, options) is None and not (tmp_path / "pwned").exists()
    entry.chmod(stat.S_IRUSR | stat.S_IWUSR)
    entry.parent.chmod(0o777)
    assert not cache.trusted(entry)
    assert cache.load(run, options) is None and not (tmp_path / "pwned").exists()
    entry.parent.chmod(0o700)


def test_callers_wanting_the_same_entry_at_once_compute_it_once(tmp_path, cache_home, monkeypatch):
    """The dashboard's start-up pass and its first page (or a report and a notebook) ask for one entry at the same
    time: the lock on its key lets one compute while the others wait and read it — one pass, same numbers."""
    import threading
    import time

    run, options = _run(tmp_path / "run"), ReportOptions()
    calls = []

    def slow_passes(*args, **kwargs):
        calls.append(threading.get_ident())
        time.sleep(0.3)  # long enough for every other caller to be waiting on the lock
        return run_passes(*args, **kwargs)

    monkeypatch.setattr(cache, "run_passes", slow_passes)
    results = [None] * 3
    threads = [threading.Thread(target=lambda i=i: results.__setitem__(i, cache.cached_passes(
        rcdiag.open_run(run.path), options))) for i in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(calls) == 1
    assert all(_numbers(r) == _numbers(results[0]) for r in results)


def test_prepare_fills_the_cache_and_skips_what_it_cannot_read(tmp_path, cache_home):
    """`python -m rcdiag.report.cache RUN…` (the dashboard's warm-up process): the entry is there afterwards; a
    broken path is left for its page to report, never an error of the warm-up."""
    import subprocess
    import sys

    run = _run(tmp_path / "run")
    missing = tmp_path / "nope"
    done = subprocess.run([sys.executable, "-m", "rcdiag.report.cache", str(missing), str(run.path)],
                          capture_output=True, text=True, env={**os.environ, cache.CACHE_ENV: str(cache_home)})
    assert done.returncode == 0 and not done.stderr
    assert cache.is_cached(run, ReportOptions())


def test_prune_drops_left_over_locks_and_temporary_files_but_not_a_held_lock(tmp_path, cache_home):
    """Each key's lock file and a killed writer's temporary file would otherwise stay forever; a lock someone holds
    (a computation still running) stays, and so does a fresh one."""
    import fcntl
    import time

    run, options = _run(tmp_path / "run"), ReportOptions()
    cache.cached_passes(run, options)
    passes_dir = cache_home / "passes"
    old = time.time() - 2 * cache.STALE_SECONDS
    stale = [passes_dir / ".gone.lock", passes_dir / ".gone.123.456.tmp"]
    held, fresh = passes_dir / ".busy.lock", passes_dir / ".new.lock"
    for path in (*stale, held, fresh):
        path.write_bytes(b"")
    for path in (*stale, held):
        os.utime(path, (old, old))
    with held.open("a+b") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        cache.store(run, options, cache.cache_key(run, options), cache.cached_passes(run, options))
    assert not any(p.exists() for p in stale) and held.exists() and fresh.exists()
    assert cache.is_cached(run, options)


def test_the_code_fingerprint_covers_every_wing_of_analysis(tmp_path, monkeypatch):
    """A source change in any module that computes the passes changes the key — also in analysis/'s wings (the
    fingerprint globbed only a folder's top level, so moving the modules into wings would have served passes
    computed by older code)."""
    root = tmp_path / "rcdiag"
    for sub in cache._SOURCES:
        (root / sub).mkdir(parents=True, exist_ok=True)
    wing = root / "analysis" / "verdict"
    wing.mkdir(parents=True, exist_ok=True)
    module = wing / "causes.py"
    module.write_text("x = 1\n")
    fake = root / "report" / "cache.py"
    fake.write_text("")
    monkeypatch.setattr(cache, "__file__", str(fake))
    cache._code_fingerprint.cache_clear()
    before = cache._code_fingerprint()
    module.write_text("x = 22\n")
    cache._code_fingerprint.cache_clear()
    try:
        assert cache._code_fingerprint() != before
    finally:
        monkeypatch.undo()
        cache._code_fingerprint.cache_clear()
