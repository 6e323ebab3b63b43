"""The `rcdiag` command line: a thin typer shell; each command lives in rcdiag/commands/<name>.py.

The shell only parses options, calls one library function, and turns a typed rcdiag error into
`Error: …` on stderr with exit code 1 (never a traceback for a user error); usage mistakes print the usage,
the error and exit code 2. Only the command being run is imported: `rcdiag report --help` never loads torch,
vLLM or transformers, and `rcdiag --help` lists the commands from the table below without importing any.
"""
from __future__ import annotations

import importlib
import sys
from dataclasses import dataclass
from typing import Any

import typer
import typer.main
from typer._click.exceptions import ClickException  # typer ≥ 0.22 raises its vendored click's exceptions
from typer.core import TyperCommand, TyperGroup

from rcdiag import __version__
from rcdiag.errors import RcdiagError


@dataclass(frozen=True)
class CommandEntry:
    """One command: the module under rcdiag.commands that defines `command(...)`, and its one-line summary
    (shown by `rcdiag --help` without importing the module)."""

    module: str
    summary: str


COMMANDS: dict[str, CommandEntry] = {
    "score": CommandEntry("score", "Generate rollouts with vLLM, then rescore them with transformers."),
    "import": CommandEntry("import_", "Turn a trainer's rollout dump (slime, verl, TRL, ms-swift, JSONL) into a run."),
    "report": CommandEntry("report", "Checks, metrics, IS simulation and a recommendation → md/html/json."),
    "probe": CommandEntry("probe", "Where the gap comes from: recompute tokens under a grid of settings."),
    "dashboard": CommandEntry("dashboard", "Open runs in the Streamlit dashboard (127.0.0.1)."),
    "export": CommandEntry("export", "Per-step metrics to TensorBoard, an offline W&B run, or CSV/JSONL."),
    "crosscheck": CommandEntry("crosscheck", "Recompute the trainer's logged rollout-correction curves; list disagreements."),
}


def load_command(name: str) -> TyperCommand:
    """The real click command of `name`, built from rcdiag.commands.<module>.command (imported now)."""
    module = importlib.import_module(f"rcdiag.commands.{COMMANDS[name].module}")
    single = typer.Typer(add_completion=False, pretty_exceptions_enable=False, rich_markup_mode="markdown")
    single.command(name)(module.command)
    command = typer.main.get_command(single)
    command.name = name
    return command


class LazyGroup(TyperGroup):
    """The root group: lists every command from COMMANDS, imports one only when it is resolved to run (or asked
    for its own --help)."""

    def __init__(self, **attrs: Any) -> None:
        super().__init__(**attrs)
        for name, entry in COMMANDS.items():
            self.commands[name] = TyperCommand(name=name, help=entry.summary, short_help=entry.summary)

    def resolve_command(self, ctx: Any, args: list[str]) -> tuple[str | None, Any, list[str]]:
        name, command, rest = super().resolve_command(ctx, args)
        if name in COMMANDS and command is self.commands.get(name) and command.callback is None:
            command = load_command(name)
        return name, command, rest


app = typer.Typer(
    cls=LazyGroup,
    name="rcdiag",
    help="Measure the training-inference log-prob mismatch of LLM RL runs and simulate its corrections.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode="markdown",
)


def _show_version(value: bool) -> None:
    if value:
        typer.echo(f"rcdiag {__version__}")
        raise typer.Exit()


@app.callback()
def _root(version: bool = typer.Option(False, "--version", callback=_show_version, is_eager=True,
                                       help="Print rcdiag's version and exit.")) -> None:
    """rcdiag: offline diagnostics for the training-inference mismatch (TIS/MIS, KL, ESS…)."""


def main(argv: list[str] | None = None) -> int:
    """Console entry point: run the app, mapping RcdiagError to `Error: …` and exit code 1, usage errors to the
    usage line + error and exit code 2."""
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
    except ClickException as exc:
        exc.show()
        return exc.exit_code
    return 0


if __name__ == "__main__":
    sys.exit(main())
