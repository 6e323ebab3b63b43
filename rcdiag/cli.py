"""The `rcdiag` command line: a thin typer shell; each command lives in rcdiag/commands/<name>.py.

The shell only parses options, calls one library function, and turns a typed rcdiag error into
`Error: …` on stderr with exit code 1 (never a traceback for a user error); usage mistakes print the usage,
the error and exit code 2. Only the command being run is imported: `rcdiag report --help` never loads torch,
vLLM or transformers, and `rcdiag --help` lists the commands from the table below without importing any.
"""
from __future__ import annotations

import difflib
import errno
import importlib
import re
import sys
from dataclasses import dataclass
from typing import Any

import typer
import typer.main
from typer._click.exceptions import (  # typer 0.29 raises its vendored click's exceptions (pinned in pyproject)
    BadParameter,
    ClickException,
    MissingParameter,
    NoSuchOption,
    UsageError,
)
from typer.core import TyperArgument, TyperCommand, TyperGroup, TyperOption

from rcdiag import __version__
from rcdiag.errors import RcdiagError


@dataclass(frozen=True)
class CommandEntry:
    """One command: the module under rcdiag.commands that defines `command(...)`, and its one-line summary
    (shown by `rcdiag --help` without importing the module)."""

    module: str
    summary: str
    warm: str = ""
    """"module:function" started before the command's module is imported (not for --help): work that runs beside
    that import, e.g. the report's figure process importing matplotlib (rcdiag.report.figproc)."""


COMMANDS: dict[str, CommandEntry] = {
    "score": CommandEntry("score", "Generate rollouts with vLLM, then rescore them with transformers."),
    "import": CommandEntry("import_", "Turn a trainer's rollout dump (slime, verl, TRL, ms-swift, JSONL) into a run."),
    "report": CommandEntry("report", "Checks, metrics, IS simulation and a recommendation → md/html/json.",
                           warm="rcdiag.report.figproc:prestart"),
    "probe": CommandEntry("probe", "Where the gap comes from: recompute tokens under a grid of settings."),
    "dashboard": CommandEntry("dashboard", "Open runs in the Streamlit dashboard (127.0.0.1)."),
    "export": CommandEntry("export", "Per-step metrics to TensorBoard, an offline W&B run, or CSV/JSONL."),
    "crosscheck": CommandEntry("crosscheck", "Recompute the trainer's logged rollout-correction curves; list disagreements."),
}


PROG = "rcdiag"
"""The program name every usage line shows (also under `python -m rcdiag`)."""
TYPE_METAVARS = {"int": "INTEGER", "float": "NUMBER", "str": "TEXT", "Path": "PATH"}
"""What a value option shows in --help instead of typer 0.29's `<int>` / `<list[Path]>` type labels."""


class PlainHelp:
    """Help that reads like click's classic one: flags show no `<bool>`, a value shows INTEGER / NUMBER / TEXT /
    PATH instead of typer 0.29's `<int>` / `<list[Path]>`, arguments are upper case (`RUNS...`)."""

    params: list[Any]

    def plain_metavars(self) -> None:
        for param in self.params:
            if param.metavar is not None:
                continue
            if isinstance(param, TyperArgument):
                param.metavar = param.name.upper() + ("..." if param.nargs != 1 else "")
                param.display_type_rich = _no_type  # the argument's name already says what it is (RUNS...)
            elif isinstance(param, TyperOption):
                param.metavar = "" if param.is_flag else _type_metavar(param)

    def get_help_option(self, ctx: Any) -> Any:
        option = super().get_help_option(ctx)  # type: ignore[misc]
        if option is not None:
            option.metavar = ""
        return option


class RcdiagCommand(PlainHelp, TyperCommand):
    """One command, with plain help and the usage line `rcdiag report [OPTIONS] RUNS...` (not `{runs}...`)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.plain_metavars()

    def collect_usage_pieces(self, ctx: Any) -> list[str]:
        pieces = [self.options_metavar] if self.options_metavar else []
        for param in self.params:
            if isinstance(param, TyperArgument):
                pieces.append(param.metavar if param.required else f"[{param.metavar}]")
        return pieces


def _no_type(ctx: Any) -> None:
    return None


def _type_metavar(param: TyperOption) -> str:
    label = param.display_type(None).strip("<>")  # e.g. "int", "list[str]", "path"
    inner = re.sub(r"^list\[(.*)\]$", r"\1", label)
    return TYPE_METAVARS.get(inner, TYPE_METAVARS.get(inner.capitalize(), inner.upper()))


def load_command(name: str) -> TyperCommand:
    """The real click command of `name`, built from rcdiag.commands.<module>.command (imported now)."""
    module = importlib.import_module(f"rcdiag.commands.{COMMANDS[name].module}")
    single = typer.Typer(add_completion=False, pretty_exceptions_enable=False, rich_markup_mode="markdown")
    single.command(name, cls=RcdiagCommand)(module.command)
    command = typer.main.get_command(single)
    command.name = name
    return command


class LazyGroup(PlainHelp, TyperGroup):
    """The root group: lists every command from COMMANDS, imports one only when it is resolved to run (or asked
    for its own --help)."""

    def __init__(self, **attrs: Any) -> None:
        super().__init__(**attrs)
        for name, entry in COMMANDS.items():
            self.commands[name] = TyperCommand(name=name, help=entry.summary, short_help=entry.summary)

    def get_params(self, ctx: Any) -> list[Any]:
        self.plain_metavars()  # the root callback's options (--version) are attached after __init__
        return super().get_params(ctx)

    def resolve_command(self, ctx: Any, args: list[str]) -> tuple[str | None, Any, list[str]]:
        name, command, rest = super().resolve_command(ctx, args)
        if name in COMMANDS and command is self.commands.get(name) and command.callback is None:
            warm = COMMANDS[name].warm
            if warm and "--help" not in rest:
                module, _, function = warm.partition(":")
                getattr(importlib.import_module(module), function)()
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
        code = app(args=argv, prog_name=PROG, standalone_mode=False)  # click returns typer.Exit's code here (standalone off)
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
    except UsageError as exc:
        show_usage_error(exc, sys.argv[1:] if argv is None else argv)
        return exc.exit_code
    except ClickException as exc:
        exc.show()
        return exc.exit_code
    except (OSError, RecursionError, UnicodeError, MemoryError) as exc:  # what the input or the disk makes happen
        typer.echo(f"Error: {environment_error(exc)}", err=True)
        return 1
    return 0


_OS_HINTS = {
    errno.ENAMETOOLONG: "choose a shorter name (a file name holds at most 255 bytes)",
    errno.EROFS: "the file system is read-only: write elsewhere (e.g. --out DIR on a writable disk)",
    errno.EACCES: "check the permissions, or write elsewhere",
    errno.EPERM: "check the permissions, or write elsewhere",
    errno.ENOSPC: "the disk is full: free space or write elsewhere (nothing half-written was left as complete)",
    errno.EDQUOT: "the disk quota is exceeded: free space or write elsewhere",
    errno.ENOTDIR: "a part of the path is a file, not a directory",
    errno.EISDIR: "a directory is where a file was expected",
    errno.ENOENT: "no such file or directory",
}


def environment_error(exc: BaseException) -> str:
    """One sentence for an error the file system or the input's shape caused, naming the path where there is
    one: a name too long, a read-only or full disk, a permission; nesting too deep; text that is not UTF-8."""
    if isinstance(exc, OSError):
        where = next((str(f) for f in (exc.filename, exc.filename2) if f), None)
        reason = exc.strerror or type(exc).__name__
        hint = _OS_HINTS.get(exc.errno or -1, "")
        return (f"{where}: " if where else "") + reason + (f" — {hint}" if hint and hint != reason.lower() else "")
    if isinstance(exc, RecursionError):
        return "the input nests deeper than rcdiag reads (a JSON value or a dump nested thousands of levels deep)"
    if isinstance(exc, UnicodeError):
        return (f"text that cannot be read or stored as UTF-8 ({str(exc)[:200]}): a lone surrogate such as \\ud800, "
                "or bytes in another encoding — fix the text in the input")
    return "more memory than this machine has was asked for — is the input what it should be?"


def show_usage_error(exc: UsageError, argv: list[str]) -> None:
    """The usage line, one plain sentence and a "did you mean" on stderr (click's wording where it is plain)."""
    if isinstance(exc, NoSuchOption):
        exc.message = _no_such_option(exc)
        exc.possibilities = None
    elif isinstance(exc, MissingParameter):
        exc.message = (exc.message or "") + _example(exc.ctx)
    elif isinstance(exc, BadParameter):
        exc.message = _bad_value(exc, argv)
    exc.show()


def _example(ctx: Any) -> str:
    """" For example: rcdiag report runs/sample" — the first example of the command's own help."""
    help_text = getattr(getattr(ctx, "command", None), "help", None) or ""
    first = next((line.strip() for line in help_text.splitlines() if line.strip().startswith(f"{PROG} ")), None)
    return f"For example: {first.split('  #')[0].strip()}" if first else ""


def _no_such_option(exc: NoSuchOption) -> str:
    """`No such option: --treshold. Did you mean --threshold?` (the closest known option first)."""
    known = list(exc.possibilities or ())
    if exc.ctx is not None and not known:
        known = [opt for p in exc.ctx.command.params for opt in (*p.opts, *p.secondary_opts)]
    close = difflib.get_close_matches(exc.option_name, known, n=2, cutoff=0.75) or sorted(known)[:3]
    hint = f" Did you mean {' or '.join(close)}?" if close else ""
    return f"No such option: {exc.option_name}.{hint}"


_PYDANTIC_WORDS = {"valid number": "a number (e.g. 2 or 0.5)", "valid integer": "a whole number (e.g. 64)",
                   "valid boolean": "true or false"}


def _bad_value(exc: BadParameter, argv: list[str]) -> str:
    """Replace typer 0.29's pydantic wording ("Input should be a valid number, unable to parse …") by the value
    given and what was expected."""
    message = exc.message
    expected = next((text for key, text in _PYDANTIC_WORDS.items() if key in message), None)
    if expected is None or exc.param is None:
        return message
    given = _given_value(exc.param.opts, argv)
    return f"{given!r} is not {expected}" if given is not None else f"expected {expected}"


def _given_value(opts: list[str], argv: list[str]) -> str | None:
    for i, arg in enumerate(argv):
        for opt in opts:
            if arg == opt and i + 1 < len(argv):
                return argv[i + 1]
            if arg.startswith(opt + "="):
                return arg[len(opt) + 1:]
    return None


if __name__ == "__main__":
    sys.exit(main())
