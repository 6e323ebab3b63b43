"""`rcdiag dashboard`: start the Streamlit dashboard (app/dashboard.py) on 127.0.0.1 for the given runs."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Annotated

import typer

from rcdiag.errors import ConfigError

HOST = "127.0.0.1"
APP_ENV = "RCDIAG_APP"
"""Environment variable naming app/dashboard.py, for installs where it does not sit next to the package."""


def app_path() -> Path:
    """app/dashboard.py: $RCDIAG_APP if set, else next to the rcdiag package (a source checkout or editable install)."""
    import rcdiag

    override = os.environ.get(APP_ENV)
    path = Path(override) if override else Path(rcdiag.__file__).resolve().parent.parent / "app" / "dashboard.py"
    if not path.is_file():
        raise ConfigError(f"dashboard app not found at {path}; install rcdiag from its source checkout "
                          f"(pip install -e '.[dashboard]') or set {APP_ENV}=/path/to/app/dashboard.py")
    return path


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free right now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((HOST, 0))
        return int(sock.getsockname()[1])


def check_port(port: int) -> None:
    """Refuse a port already taken before the URL is printed (Streamlit would only fail after it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as Tornado does: TIME_WAIT is no conflict
        try:
            sock.bind((HOST, port))
        except OSError as exc:
            raise ConfigError(f"--port {port}: cannot listen on {HOST}:{port} ({exc.strerror}); choose another "
                              "port, or omit --port for a free one") from None


def streamlit_command(app: Path, runs: list[Path], port: int) -> list[str]:
    """The `streamlit run` command line (through app/serve.py, which serves Streamlit's front end told that its
    backend is at the root, so deep links probe no /<page>/_stcore/… paths): bound to 127.0.0.1, headless, no
    telemetry, no tracebacks or deploy button in the page; run paths after `--`."""
    serve = app.parent / "serve.py"
    launcher = [str(serve)] if serve.is_file() else ["-m", "streamlit"]
    return [sys.executable, *launcher, "run", str(app),
            "--server.address", HOST, "--server.port", str(port), "--server.headless", "true",
            "--browser.gatherUsageStats", "false", "--client.showErrorDetails", "none",
            "--client.toolbarMode", "minimal", "--server.fileWatcherType", "none",
            "--", *(str(r) for r in runs)]


def command(
    runs: Annotated[list[Path], typer.Argument(help="Run directories to open (the first is shown first).")],
    port: Annotated[int, typer.Option("--port", help="Port on 127.0.0.1 (default 0: a free port).")] = 0,
) -> None:
    """Open the dashboard on one or more run directories (served on 127.0.0.1 only).

    The sidebar opens these runs and any run directory under the current working directory; others are
    refused. Stop it with Ctrl-C.

    Examples:

        rcdiag dashboard runs/sample

        rcdiag dashboard runs/bf16 runs/fp32 --port 8601
    """
    for run in runs:
        if not run.is_dir():
            from rcdiag.store.run import missing_run  # pyarrow only on this error path: --help stays light

            raise missing_run(run)
    if not 0 <= port <= 65535:
        raise ConfigError(f"--port {port}: must be between 1 and 65535 (0 picks a free port)")
    try:
        import streamlit  # noqa: F401
    except ImportError:
        raise ConfigError("the dashboard needs streamlit: pip install 'rcdiag[dashboard]'") from None
    port = port or free_port()
    check_port(port)
    resolved = [r.resolve() for r in runs]
    cmd = streamlit_command(app_path(), resolved, port)
    typer.echo(f"rcdiag dashboard: http://{HOST}:{port}  (Ctrl-C to stop)")
    code = serve(cmd, lambda: warm_up(resolved))
    if code:
        raise typer.Exit(code)


def warm_up(runs: list[Path]) -> subprocess.Popen:
    """Start the report's pass over `runs` in a process of its own while the server starts
    (`python -m rcdiag.report.cache RUN…`; nothing when the pass cache is off): the Overview then reads the pass
    cache, or waits on the entry being computed, instead of making the pass after the page was asked for. The
    heavy imports happen there, not here, so the server's start is not delayed; it runs in a session of its own,
    so Ctrl-C in the terminal stops it through the dashboard (SIGTERM), never with a traceback of its own."""
    return subprocess.Popen([sys.executable, "-m", "rcdiag.report.cache", *map(str, runs)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)


def serve(cmd: list[str], start_warm_up: Callable[[], subprocess.Popen] | None = None) -> int:
    """Run the server until it exits, with the process `start_warm_up()` returns beside it (started once the
    server is); Ctrl-C or SIGTERM stops both (never leaving either running). Exit code."""
    child = subprocess.Popen(cmd)
    previous = signal.signal(signal.SIGTERM, _interrupt)
    warm = None
    try:
        try:
            warm = start_warm_up() if start_warm_up is not None else None
        except OSError:  # no warm-up: the pages make the pass themselves, as without one
            warm = None
        return child.wait()
    except KeyboardInterrupt:
        child.terminate()
        try:
            child.wait(timeout=10)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()
        typer.echo("rcdiag dashboard: stopped", err=True)
        return 0
    finally:
        signal.signal(signal.SIGTERM, previous)
        if warm is not None and warm.poll() is None:
            warm.terminate()
            warm.wait(timeout=10)


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt
