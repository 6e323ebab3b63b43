"""The `rcdiag` command line: a thin typer shell; each command lives in rcdiag/commands/<name>.py.

The shell only parses options, calls one library function, and turns a typed rcdiag error into
`Error: …` on stderr with exit code 1 (never a traceback for a user error).
"""
from __future__ import annotations

import importlib
import sys

import typer

from rcdiag.errors import RcdiagError

app = typer.Typer(
    name="rcdiag",
    help="Measure the training-inference log-prob mismatch of LLM RL runs and simulate its corrections.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode="markdown",
)

# (command name, module under rcdiag.commands). Each module defines `command(...)` with typer options and a
# docstring whose examples `--help` shows.
COMMANDS: list[tuple[str, str]] = [
    ("dashboard", "dashboard"),
    ("import", "import_"),
    ("score", "score"),
    ("report", "report"),
    ("probe", "probe"),
]


def _register() -> None:
    for name, module in COMMANDS:
        app.command(name)(importlib.import_module(f"rcdiag.commands.{module}").command)


@app.callback()
def _root() -> None:
    """rcdiag: offline diagnostics for the training-inference mismatch (TIS/MIS, KL, ESS…)."""


def main(argv: list[str] | None = None) -> int:
    """Console entry point: run the app, mapping RcdiagError to `Error: …` and exit code 1."""
    _register()
    try:
        code = app(args=argv, standalone_mode=False)  # click returns typer.Exit's code here (standalone off)
        if isinstance(code, int) and code:
            return code
    except RcdiagError as exc:
        typer.echo(f"Error: {exc}", err=True)
        return 1
    except typer.Exit as exc:
        return exc.exit_code
    except typer.Abort:
        typer.echo("Aborted.", err=True)
        return 130
    except KeyboardInterrupt:
        typer.echo("Interrupted; completed shards are kept — re-run the same command to resume.", err=True)
        return 130
    except Exception as exc:  # click usage errors
        import click

        if isinstance(exc, click.ClickException):
            exc.show()
            return exc.exit_code
        raise
    return 0


if __name__ == "__main__":
    sys.exit(main())
