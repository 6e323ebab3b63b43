"""`rcdiag dashboard`: help text, argument errors, the streamlit command line it builds, finding the app."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from rcdiag.cli import main
from rcdiag.commands import dashboard

RCDIAG = Path(sys.executable).with_name("rcdiag")


def test_help_shows_examples():
    out = subprocess.run([str(RCDIAG), "dashboard", "--help"], capture_output=True, text=True, check=True).stdout
    assert "rcdiag dashboard runs/sample" in out and "--port" in out and "127.0.0.1" in out


def test_missing_run_is_an_error(tmp_path, capsys):
    assert main(["dashboard", str(tmp_path / "nope")]) == 1
    assert f"Error: {tmp_path / 'nope'}: no such run directory" in capsys.readouterr().err


def test_bad_port_is_an_error(tmp_path, capsys):
    assert main(["dashboard", str(tmp_path), "--port", "70000"]) == 1
    assert "--port 70000" in capsys.readouterr().err


def test_streamlit_command_binds_localhost_and_passes_runs(tmp_path):
    runs = [tmp_path / "a", tmp_path / "b"]
    cmd = dashboard.streamlit_command(dashboard.app_path(), runs, 8123)
    assert cmd[1].endswith("app/serve.py") and cmd[2] == "run" and cmd[3].endswith("app/dashboard.py")
    assert cmd[cmd.index("--server.address") + 1] == "127.0.0.1"
    assert cmd[cmd.index("--server.port") + 1] == "8123"
    assert cmd[cmd.index("--") + 1:] == [str(r) for r in runs]


def test_app_found_next_to_the_package_and_overridable(tmp_path, monkeypatch):
    assert dashboard.app_path() == Path(__file__).resolve().parents[2] / "app" / "dashboard.py"
    monkeypatch.setenv(dashboard.APP_ENV, str(tmp_path / "missing.py"))
    with pytest.raises(dashboard.ConfigError, match="RCDIAG_APP"):
        dashboard.app_path()


def test_free_port_is_bindable():
    import socket

    port = dashboard.free_port()
    assert 1024 <= port <= 65535  # an ephemeral port the OS picked, never 0 ("any") or a privileged one
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))
        assert sock.getsockname() == ("127.0.0.1", port)  # bound to exactly that port


def test_a_warm_up_that_cannot_start_leaves_the_server_running_to_its_end(tmp_path):
    """serve() starts the warm-up after the server: if that fails (no process could be made) the server is still
    waited for, not left behind by an exception."""
    import sys

    def broken() -> None:
        raise OSError("no process")

    code = dashboard.serve([sys.executable, "-c", "import sys; sys.exit(3)"], broken)
    assert code == 3
