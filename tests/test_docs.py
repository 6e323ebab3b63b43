"""The documentation is tested like code: every README command and every command's `--help` example parses to a
valid invocation, the cheap ones run for real against small runs built here, every relative link and citation of
README.md and docs/*.md resolves, the generated tables equal the code, and every number the library returns is
described in docs/metrics.md.

Guards issue #33: the project pointed 42 times at METRICS.md and DESIGN.md, which are not in the repository, and
only hand-picked README commands ran in a test (sqlite-utils' tests/test_docs.py parametrizes over its CLI's
commands; this does the same over the README's shell blocks and cli.COMMANDS' examples).
"""
from __future__ import annotations

import importlib
import importlib.util
import json
import re
import shlex
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from rcdiag.cli import COMMANDS, load_command, main
from tests.docs_tables import TABLES, current_block

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))
SHELL_BLOCK = re.compile(r"^```(?:bash|sh|shell|console)\n(.*?)^```", re.M | re.S)


# ----------------------------------------------------------------------------------------------- the commands
@dataclass(frozen=True)
class Example:
    """One documented command line: where it is written and its argv (comments stripped as a shell would)."""

    where: str
    argv: tuple[str, ...]

    @property
    def text(self) -> str:
        return shlex.join(self.argv)


def _lines(text: str, where: str, prefix: str = "") -> Iterator[Example]:
    """Each line (starting with `prefix`, when given) as an Example."""
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip().startswith(prefix):
            continue
        argv = shlex.split(line, comments=True)
        if argv:
            yield Example(f"{where}:{number}", tuple(argv))


def readme_lines() -> list[Example]:
    """Every command line of the README's fenced shell blocks (line numbers count within the block)."""
    text = README.read_text(encoding="utf-8")
    return [e for i, block in enumerate(SHELL_BLOCK.findall(text), 1) for e in _lines(block, f"README block {i}")]


def help_examples(name: str) -> list[Example]:
    """The `rcdiag …` lines of one command's --help text."""
    help_text = load_command(name).help or ""
    return list(_lines(help_text, f"rcdiag {name} --help", prefix="rcdiag "))


def documented_commands() -> list[Example]:
    """Every rcdiag command line of the README and of every command's --help, each once (first place wins)."""
    seen: dict[tuple[str, ...], Example] = {}
    for example in [e for e in readme_lines() if e.argv[0] == "rcdiag"] + [
            e for name in COMMANDS for e in help_examples(name)]:
        seen.setdefault(example.argv, example)
    return list(seen.values())


EXAMPLES = documented_commands()


def test_every_command_is_in_the_readme_and_has_help_examples() -> None:
    """Each command of cli.COMMANDS appears in a README shell block and shows at least one example in its --help
    (a new command documented nowhere fails here)."""
    in_readme = {e.argv[1] for e in readme_lines() if e.argv[0] == "rcdiag" and len(e.argv) > 1}
    assert set(COMMANDS) <= in_readme, f"not in any README shell block: {sorted(set(COMMANDS) - in_readme)}"
    assert [name for name in COMMANDS if not help_examples(name)] == []


def test_readme_make_targets_exist() -> None:
    """`make X` in the README names a target of the Makefile."""
    targets = set(re.findall(r"^([A-Za-z][\w-]*):", (ROOT / "Makefile").read_text(), re.M))
    wanted = {e.argv[1] for e in readme_lines() if e.argv[0] == "make" and len(e.argv) > 1}
    assert wanted and wanted <= targets, f"missing Makefile targets: {sorted(wanted - targets)}"


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda e: e.text[:90])
def test_documented_command_parses(example: Example) -> None:
    """The command line parses into a valid invocation of its command (typer/click `make_context`: names, option
    spellings, types, choices and counts) without running it — the expensive ones (vLLM, the probe, Ray) included."""
    argv = example.argv
    assert len(argv) > 1 and argv[1] in COMMANDS, f"{example.where}: not an rcdiag command: {example.text}"
    command = load_command(argv[1])
    with command.make_context(argv[1], list(argv[2:])) as ctx:
        assert ctx.command is command


@pytest.mark.parametrize("argv", [("report", "runs/sample", "--treshold", "2"), ("report", "runs/sample",
                                                                              "--threshold", "two"),
                                  ("export", "runs/steps", "tb/"), ("probe", "runs/sample", "--sample", "many")])
def test_a_wrong_command_line_does_not_parse(argv: tuple[str, ...]) -> None:
    """The parse check can fail: a misspelled option, a value of the wrong type, a missing required option."""
    from typer._click.exceptions import UsageError  # typer raises its vendored click's exceptions

    with pytest.raises(UsageError):
        load_command(argv[0]).make_context(argv[0], list(argv[1:]))


@pytest.mark.parametrize("name", list(COMMANDS))
def test_command_help_runs(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    """`rcdiag NAME --help` exits 0 with the usage line and its examples (what a user reads first)."""
    assert main([name, "--help"]) == 0
    out = capsys.readouterr().out
    assert f"Usage: rcdiag {name}" in out
    assert help_examples(name)[0].argv[1] == name
    assert "rcdiag " + name in out.split("Usage:", 1)[1]


def test_root_help_lists_every_command(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    assert [name for name in COMMANDS if name not in out] == []


# ----------------------------------------------------------------------------------------------- run for real
GATES = ("--fail-if", "--fail-on", "--fail-on-drift")


@dataclass(frozen=True)
class Expect:
    """What a command that runs for real must leave: exit code (None: a CI gate, 0 or 1 as its data decide) and
    paths it writes, relative to where it ran."""

    rc: int | None = 0
    writes: tuple[str, ...] = ()
    bug: str = ""
    """A known defect that makes the documented command fail (the test is then a strict xfail naming it)."""


REPORT = ("report.html", "report.md", "metrics.json")

RUN_FOR_REAL: dict[str, Expect] = {
    "rcdiag import slime dump_dir/ --out runs/slime --allow-pickle": Expect(writes=("runs/slime/manifest.json",)),
    "rcdiag import jsonl rollouts.jsonl --out runs/mine --response-ids-field completion_ids "
    "--rollout-logprobs-field logprobs": Expect(writes=("runs/mine/manifest.json",)),
    "rcdiag import jsonl trl_batch.jsonl --out runs/trl --tokenizer ./model":
        Expect(writes=("runs/trl/manifest.json",)),
    "rcdiag import nemo-rl logs/exp/ --out runs/nemo": Expect(writes=("runs/nemo/manifest.json",)),
    "rcdiag import prime-rl outputs/ --out runs/prime": Expect(writes=("runs/prime/manifest.json",)),
    "rcdiag import trl outputs/completions/ --out runs/trl --tokenizer ./model":
        Expect(writes=("runs/trl/manifest.json",)),
    "rcdiag import sglang generate.jsonl --out runs/moe --tokenizer ./moe-model":
        Expect(writes=("runs/moe/manifest.json",)),
    "rcdiag import jsonl areal_trajectories.jsonl -o runs/async": Expect(writes=("runs/async/manifest.json",)),
    "rcdiag report runs/sample": Expect(writes=tuple(f"runs/sample/report/{f}" for f in REPORT)),
    "rcdiag report runs/sample --convention verl --threshold 2 --lower 0.5":
        Expect(writes=("runs/sample/report/metrics.json",)),  # L on verl's masks only (correction.lower_for)
    "rcdiag report runs/sample --convention verl --threshold 2 --lower 0.5 --out reports/sample":
        Expect(writes=tuple(f"reports/sample/{f}" for f in REPORT)),
    "rcdiag report runs/bf16 runs/fp16 --out reports/bf16-vs-fp16":
        Expect(writes=tuple(f"reports/bf16-vs-fp16/{f}" for f in REPORT)),
    'rcdiag report runs/sample --quiet --fail-if "k3_kl>1e-3" --fail-if "ess<0.9"': Expect(rc=0),
    "rcdiag report runs/sample --quiet --fail-on warning": Expect(rc=None),
    "rcdiag report runs/sample --quiet --fail-on alarm": Expect(rc=None),
    "rcdiag report runs/verl --keys verl": Expect(writes=("runs/verl/report/metrics.json",)),
    'rcdiag report runs/new-vllm --baseline runs/old-vllm --fail-if "k3_kl>2x"': Expect(rc=1),
    "rcdiag report runs/steps --fail-on-drift": Expect(rc=0, writes=("runs/steps/report/metrics.json",)),
    "rcdiag report runs/async": Expect(writes=("runs/async/report/metrics.json",)),
    "rcdiag export runs/steps --to tensorboard tb/ --keys verl": Expect(writes=("tb",)),
    "rcdiag export runs/steps --to wandb wb/ --keys swift": Expect(writes=("wb/wandb",)),
    "rcdiag export runs/steps --to csv steps.csv": Expect(writes=("steps.csv",)),
    "rcdiag crosscheck runs/steps --tensorboard outputs/tb --keys verl --threshold 2": Expect(rc=0),
    "rcdiag crosscheck runs/steps --wandb wandb/offline-run-20260101_000000-abc123": Expect(rc=0),
    "rcdiag crosscheck runs/steps --csv history.csv --keys trl --mode sequence_mask --threshold 3": Expect(rc=0),
}
"""The documented commands that run here for real (shlex-joined, comments stripped), and what each must do. The
others — scoring with vLLM, the probe, Ray, the dashboard's server, dumps under ~/ — are only parsed above."""
BY_ARGV = {e.argv: e for e in EXAMPLES}


def _argv(text: str) -> tuple[str, ...]:
    return tuple(shlex.split(text))


def test_run_table_names_documented_commands() -> None:
    """Every entry of RUN_FOR_REAL is a command the docs still show (an edited README line must not leave its old
    form here, running nothing)."""
    assert [text for text in RUN_FOR_REAL if _argv(text) not in BY_ARGV] == []


@pytest.fixture(scope="module")
def workspace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A working directory holding every path the commands above name: runs, dumps of each format, tracker logs."""
    from tests import readme_workspace

    root = tmp_path_factory.mktemp("readme")
    readme_workspace.build(root)
    return root


def _cwd_for(argv: tuple[str, ...], workspace: Path, tmp_path: Path) -> Path:
    """Where to run: the workspace; for an import (which refuses an existing --out), a fresh directory with the
    workspace's inputs linked in and an empty runs/."""
    if argv[1] != "import":
        return workspace
    for entry in workspace.iterdir():
        if entry.name != "runs":
            (tmp_path / entry.name).symlink_to(entry)
    (tmp_path / "runs").mkdir()
    return tmp_path


@pytest.mark.parametrize("text", [
    pytest.param(t, id=t, marks=[pytest.mark.xfail(strict=True, reason=e.bug)] if e.bug else [])
    for t, e in RUN_FOR_REAL.items() if _argv(t) in BY_ARGV])
def test_documented_command_runs(text: str, workspace: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                 capsys: pytest.CaptureFixture[str]) -> None:
    """The command as the docs show it runs to its documented end: exit 0 (a CI gate: 0 or 1, as its numbers say),
    what it promises written, no `Error:` and no traceback."""
    argv, expect = _argv(text), RUN_FOR_REAL[text]
    cwd = _cwd_for(argv, workspace, tmp_path)
    monkeypatch.chdir(cwd)
    rc = main(list(argv[1:]))
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err and "Error:" not in err, f"{text}\n{err[-3000:]}"
    if expect.rc is None:
        assert rc in (0, 1) and any(g in argv for g in GATES), f"{text}: exit {rc}\n{err[-2000:]}"
    else:
        assert rc == expect.rc, f"{text}: exit {rc}, expected {expect.rc}\n{out[-2000:]}\n{err[-2000:]}"
    missing = [p for p in expect.writes if not (cwd / p).exists()]
    assert missing == [], f"{text}: did not write {missing}"
    if "--fail-on" in argv:
        _check_fail_on(argv, rc, cwd)


def _check_fail_on(argv: tuple[str, ...], rc: int, cwd: Path) -> None:
    """`--fail-on LEVEL` exits 1 exactly when the report's verdict is at least LEVEL (n/a meets every level)."""
    from rcdiag.analysis.verdict.health import at_least

    level = argv[argv.index("--fail-on") + 1]
    status = json.loads((cwd / argv[2] / "report" / "metrics.json").read_text())["verdict"]["status"]
    assert rc == int(at_least(status, level)), f"verdict {status}, --fail-on {level}, exit {rc}"


# ----------------------------------------------------------------------------------------------- links
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
CITATION = re.compile(r"(docs/[\w-]+\.md), '([^']+)'")


def _slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped (letters, digits, '-', '_' kept), spaces to
    '-'."""
    text = re.sub(r"[`*]", "", heading.strip().lower())
    return "".join(ch for ch in text if ch.isalnum() or ch in "-_ ").replace(" ", "-")


def headings(path: Path) -> list[str]:
    """The Markdown headings of a document (outside fenced code)."""
    text = re.sub(r"^```.*?^```", "", path.read_text(encoding="utf-8"), flags=re.M | re.S)
    return [m.group(1).strip() for m in re.finditer(r"^#{1,6}\s+(.+)$", text, re.M)]


PENDING: dict[str, str] = {}
"""Link targets another engineer is writing now: linked already, checked by test_pending_targets_still_pending."""


def _links() -> list[tuple[Path, str]]:
    found = []
    for doc in [README, *DOCS]:
        text = re.sub(r"^```.*?^```", "", doc.read_text(encoding="utf-8"), flags=re.M | re.S)
        found += [(doc, target) for target in LINK.findall(text)
                  if not re.match(r"^[a-z][a-z0-9+.-]*:", target)]  # http:, https:, mailto: are not files
    return found


@pytest.mark.parametrize("doc,target", _links(), ids=lambda x: x if isinstance(x, str) else x.name)
def test_relative_link_resolves(doc: Path, target: str) -> None:
    """A relative link of README.md or docs/*.md points at a file of the checkout, and its #anchor at a heading."""
    path, _, anchor = target.partition("#")
    file = (doc.parent / path).resolve() if path else doc
    relative = file.relative_to(ROOT).as_posix() if file.is_relative_to(ROOT) else str(file)
    if relative in PENDING:
        pytest.skip(f"{relative}: {PENDING[relative]}")
    assert file.exists(), f"{doc.name}: link to {target} — no such file"
    if anchor and file.suffix == ".md":
        assert anchor in {_slug(h) for h in headings(file)}, f"{doc.name}: no heading for #{anchor} in {relative}"


def test_pending_targets_still_pending() -> None:
    """Once a PENDING target exists, it is checked like any other link: remove it from PENDING."""
    landed = [target for target in PENDING if (ROOT / target).exists()]
    assert landed == [], f"{landed} exist now: remove them from tests/test_docs.py PENDING"


def tracked_files() -> list[Path]:
    out = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    return [ROOT / line for line in out.splitlines() if line and (ROOT / line).is_file()]


def _text_files() -> Iterator[tuple[Path, str]]:
    for file in tracked_files():
        if file.suffix in {".png", ".jpg", ".parquet", ".safetensors", ".bin", ".gguf", ".pt", ".ico"}:
            continue
        try:
            yield file, file.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue


def test_code_citations_of_the_docs_resolve() -> None:
    """`docs/metrics.md, 'Section'` in any tracked file (the verdict's rule sources, the report's notes) names a
    heading that the document has."""
    bad = []
    for file, text in _text_files():
        if file == Path(__file__).resolve():  # this docstring's example
            continue
        for doc, section in CITATION.findall(text):
            if not (ROOT / doc).exists() or section not in headings(ROOT / doc):
                bad.append(f"{file.relative_to(ROOT)}: {doc}, '{section}'")
    assert bad == []


TEAM_DOCS = re.compile(r"\b(?:METRICS|DESIGN)\.md\b")


def _mentions(pattern: re.Pattern[str]) -> list[str]:
    me = Path(__file__).resolve()
    return [f"{file.relative_to(ROOT)}:{n}" for file, text in _text_files() if file != me
            for n, line in enumerate(text.splitlines(), 1) if pattern.search(line)]


def test_no_file_points_at_metrics_or_design_md() -> None:
    """No tracked file names METRICS.md or DESIGN.md (team notes outside the repository) except as docs/metrics.md
    or docs/design.md."""
    assert _mentions(TEAM_DOCS) == []


TEAM_NOTES = re.compile(r"\bresearch/[\w.-]+\.md\b|\bSTYLE\.md\b")


def test_no_file_points_at_the_team_notes() -> None:
    """No tracked file cites the team's research notes or STYLE.md, which a reader of the checkout cannot open."""
    assert _mentions(TEAM_NOTES) == []


# ----------------------------------------------------------------------------------------------- the code's tables
@pytest.mark.parametrize("name", list(TABLES))
def test_generated_table_is_current(name: str) -> None:
    """A generated block of docs/ (the layer rules, the gate families, the health bands) equals what the code
    gives now; after a change: `python -m tests.docs_tables`."""
    document, render = TABLES[name]
    assert current_block(name) is not None, f"docs/{document}: the '{name}' block's markers are missing"
    assert current_block(name) == render(), f"docs/{document} '{name}' is stale: run python -m tests.docs_tables"


def test_layer_table_is_the_import_rule() -> None:
    """Read back from design.md, the table gives exactly tests/test_imports.py's ALLOWED (guards a hand edit of the
    doc's block that the renderer would not make)."""
    from tests.test_imports import ALLOWED

    rows = [line.split(" | ") for line in current_block("layers").splitlines()[2:]]
    read = {row[0].strip("| "): set(row[2].split(", ")) for row in rows}
    assert read == ALLOWED


NAME_LISTS = (
    ("rcdiag.analysis.metrics.compute", "METRIC_NAMES"), ("rcdiag.analysis.metrics.compute", "COUNT_NAMES"),
    ("rcdiag.analysis.correction.isstats", "IS_METRIC_NAMES"), ("rcdiag.analysis.distributions.tails", "TAIL_NAMES"),
    ("rcdiag.analysis.correction.verlstats", "IS_SEQ_NAMES"), ("rcdiag.analysis.correction.verlstats", "PROBS_NAMES"),
    ("rcdiag.analysis.correction.gates", "GATE_METRIC_NAMES"), ("rcdiag.analysis.correction.rejection", "OPTIONS"),
    ("rcdiag.analysis.conventions", "CONVENTIONS"), ("rcdiag.analysis.metrics.floor", "NOISE_NAMES"),
    ("rcdiag.analysis.metrics.bootstrap", "HEADLINE"), ("rcdiag.analysis.distributions.divergence", "PER_POSITION"),
    ("rcdiag.checks.verdicts", "VERDICTS"), ("rcdiag.analysis.training.lag_trend", "LAG_NAMES"),
)
"""The library's lists of the names it returns: each must be described in docs/metrics.md."""


def _names(module: str, attribute: str) -> list[str]:
    """The names of one list; for the checks (a table of functions), the Finding names their source builds."""
    value = getattr(importlib.import_module(module), attribute)
    if attribute == "VERDICTS":
        source = Path(importlib.util.find_spec(module).origin).read_text(encoding="utf-8")
        return sorted(set(re.findall(r'(?:Finding|_ok)\("(\w+)"', source)))
    return list(value)


@pytest.mark.parametrize("module,attribute", NAME_LISTS, ids=lambda x: x)
def test_every_returned_name_is_in_metrics_md(module: str, attribute: str) -> None:
    """Each name in the list (a metric, a check, a convention, a rejection option) appears in docs/metrics.md as
    `name`: a new metric without its formula in the docs fails here."""
    if importlib.util.find_spec(module) is None:
        pytest.skip(f"{module} is not in this checkout")
    text = (ROOT / "docs" / "metrics.md").read_text(encoding="utf-8")
    names = _names(module, attribute)
    assert names
    assert [n for n in names if f"`{n}`" not in text] == []
