"""`rcdiag dashboard`: start the Streamlit dashboard (app/dashboard.py) on 127.0.0.1 for the given runs."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import Annotated

import typer

from rcdiag.errors import ConfigError, RunDirError

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
    """The `streamlit run` command line: bound to 127.0.0.1, headless, no telemetry, no tracebacks or deploy
    button in the page; run paths after `--`."""
    return [sys.executable, "-m", "streamlit", "run", str(app),
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
            raise RunDirError(f"{run}: no such run directory")
    if not 0 <= port <= 65535:
        raise ConfigError(f"--port {port}: must be between 1 and 65535 (0 picks a free port)")
    try:
        import streamlit  # noqa: F401
    except ImportError:
        raise ConfigError("the dashboard needs streamlit: pip install 'rcdiag[dashboard]'") from None
    port = port or free_port()
    check_port(port)
    cmd = streamlit_command(app_path(), [r.resolve() for r in runs], port)
    typer.echo(f"rcdiag dashboard: http://{HOST}:{port}  (Ctrl-C to stop)")
    code = serve(cmd)
    if code:
        raise typer.Exit(code)


def serve(cmd: list[str]) -> int:
    """Run the server until it exits; Ctrl-C or SIGTERM stops it (and never leaves it running). Exit code."""
    child = subprocess.Popen(cmd)
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
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


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt
