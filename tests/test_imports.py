"""The package layout's rules (docs/design.md, 'Package layout'), read from every module's imports with `ast` — at module
level AND inside functions, so a lazy import cannot hide a cycle or a layer breach.

Guards the first wave's defect: `runstore` (the bottom) lazily imported the Jupyter layer, tying 18 modules into
one import cycle; `gate` reached up into `report` for two constants; private helpers were imported across files.
"""
from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

LAYER_OF = {
    "rcdiag": "ground", "rcdiag.errors": "ground", "rcdiag.progress": "ground", "rcdiag.tokenizers": "ground",
    "rcdiag.lazy": "ground", "rcdiag.numbers": "ground", "rcdiag.__main__": "cli", "rcdiag.cli": "cli", "rcdiag.notebook": "notebook",
    "rcdiag.runstore": "compat", "rcdiag.sample": "compat",
}
"""Top-level modules' layers; a subpackage's modules take the subpackage's name as their layer."""

ALLOWED = {
    "ground": {"ground"},
    "store": {"ground", "store"},
    "analysis": {"ground", "store", "analysis"},
    "checks": {"ground", "store", "analysis", "checks"},
    "score": {"ground", "store", "score"},
    "importers": {"ground", "store", "importers"},
    "record": {"ground", "store", "importers", "record"},
    "probe": {"ground", "store", "analysis", "score", "probe"},
    "report": {"ground", "store", "analysis", "checks", "probe", "report"},
    "trackers": {"ground", "store", "analysis", "trackers"},
    "notebook": {"ground", "store", "analysis", "checks", "importers", "report", "notebook"},
    "distributed": {"ground", "store", "analysis", "checks", "score", "probe", "report", "distributed"},
    "commands": {"ground", "store", "analysis", "checks", "score", "importers", "probe", "report", "trackers",
                 "notebook", "distributed", "record", "commands"},
    "cli": {"ground", "commands", "cli"},
    "compat": {"ground", "store", "score"},
    "app": {"ground", "store", "analysis", "checks", "probe", "report", "notebook", "app"},
}
"""Which layers a layer may import (docs/design.md): store only the ground floor; analysis/checks/score/importers the
store; score never analysis or report; probe score and analysis, never report; report may use probe, never
notebook/app/cli/distributed; nothing imports cli, commands or app (the cli loads commands by name)."""


WINGS = ("passes", "correction", "metrics", "distributions", "moe", "training", "verdict")
"""analysis/'s wings, bottom first (docs/design.md, 'Package layout'): a wing may import the analysis ground files
(defaults, conventions, thresholds, keys, the package face) and the wings before it, never one after it — the pass
engine knows no metric, a metric no verdict, the verdict sits on everything it judges."""


def wing(module: str) -> str | None:
    """The analysis wing of `module` ("ground" for analysis/'s own files), None outside analysis/."""
    parts = module.split(".")
    if parts[:2] != ["rcdiag", "analysis"]:
        return None
    return parts[2] if len(parts) > 3 and parts[2] in WINGS else (
        parts[2] if len(parts) == 3 and parts[2] in WINGS else "ground")


def wing_allows(source: str, target: str) -> bool:
    """Whether wing `source` may import wing `target` (ground files: only the ground)."""
    if target == "ground":
        return True
    if source == "ground":
        return False
    return WINGS.index(target) <= WINGS.index(source)


def modules(root: Path = ROOT) -> dict[str, Path]:
    """Every module of rcdiag/ and app/ → its file."""
    found = {}
    for base in ("rcdiag", "app"):
        for file in sorted((root / base).rglob("*.py")):
            parts = list(file.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = file
    return found


def layer(module: str) -> str:
    if module in LAYER_OF:
        return LAYER_OF[module]
    parts = module.split(".")
    return "app" if parts[0] == "app" else parts[1]


def imports(module: str, file: Path, known: dict[str, Path]) -> Iterator[tuple[str, str, int]]:
    """(imported module, imported name or '', line) for every import statement anywhere in `file`."""
    package = module if file.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(file.read_text(), str(file))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                target = _resolve(alias.name, known)
                if target:
                    yield target, "", node.lineno
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([node.module] if node.module else []))
            for alias in node.names:
                submodule = f"{base}.{alias.name}"
                if submodule in known:
                    yield submodule, "", node.lineno
                else:
                    target = _resolve(base, known)
                    if target:
                        yield target, alias.name, node.lineno


def _resolve(name: str, known: dict[str, Path]) -> str | None:
    while name and name not in known:
        name = name.rpartition(".")[0]
    return name or None


def graph(root: Path = ROOT) -> tuple[dict[str, set[str]], list[str]]:
    """(module → imported modules, human-readable breaches of the layer and private-name rules)."""
    known = modules(root)
    edges: dict[str, set[str]] = {m: set() for m in known}
    breaches = []
    for module, file in known.items():
        for target, name, line in imports(module, file, known):
            if target == module:
                continue
            edges[module].add(target)
            where = f"{file.relative_to(root)}:{line}"
            if layer(target) not in ALLOWED[layer(module)]:
                breaches.append(f"{where}: {module} ({layer(module)}) imports {target} ({layer(target)})")
            source_wing, target_wing = wing(module), wing(target)
            if source_wing and target_wing and not wing_allows(source_wing, target_wing):
                breaches.append(f"{where}: {module} (analysis wing {source_wing}) imports {target} "
                                f"(wing {target_wing}, after it)")
            if name.startswith("_") and not name.startswith("__"):
                breaches.append(f"{where}: {module} imports the private name {target}.{name}")
    return edges, breaches


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    counter = 0
    for start in sorted(edges):
        if start in index:
            continue
        work = [(start, iter(sorted(edges[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_no_import_cycles() -> None:
    edges, _ = graph()
    assert cycles(edges) == []


def test_layers_and_private_names() -> None:
    _, breaches = graph()
    assert breaches == [], "\n".join(breaches)


def _copy_sources(tmp_path: Path) -> None:
    """rcdiag/ and app/'s modules copied under `tmp_path`, for a test to plant a breach in."""
    for base in ("rcdiag", "app"):
        for file in (ROOT / base).rglob("*.py"):
            target = tmp_path / file.relative_to(ROOT)
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(file.read_text())


def test_rules_catch_a_readded_lazy_import(tmp_path: Path) -> None:
    """Re-adding the first wave's `runstore → notebook` lazy import (inside a method) must fail both rules."""
    _copy_sources(tmp_path)
    run_file = tmp_path / "rcdiag/store/run.py"
    run_file.write_text(run_file.read_text() + "\n\ndef _notebook():\n    import rcdiag.notebook\n\n"
                        "    return rcdiag.notebook\n")
    edges, breaches = graph(tmp_path)
    assert any("rcdiag.store.run" in c and "rcdiag.notebook" in c for c in cycles(edges))
    assert any("rcdiag.store.run (store) imports rcdiag.notebook (notebook)" in b for b in breaches)


def test_rules_catch_a_wing_back_arrow(tmp_path: Path) -> None:
    """The pass engine importing the verdict (a back-arrow between wings, even inside a function) is a breach."""
    _copy_sources(tmp_path)
    engine = tmp_path / "rcdiag/analysis/passes/engine.py"
    engine.write_text(engine.read_text() + "\n\ndef _judge():\n    from rcdiag.analysis.verdict import health\n\n"
                      "    return health\n")
    _, breaches = graph(tmp_path)
    assert any("rcdiag.analysis.passes.engine (analysis wing passes) imports rcdiag.analysis.verdict.health" in b
               for b in breaches), breaches


def test_analysis_is_in_wings() -> None:
    """analysis/ holds its wings and only a few ground files (issue #46: 41 modules in one room)."""
    ground = sorted(p.name for p in (ROOT / "rcdiag/analysis").glob("*.py"))
    assert ground == ["__init__.py", "conventions.py", "defaults.py", "keys.py", "thresholds.py"], ground
    assert sorted(p.name for p in (ROOT / "rcdiag/analysis").iterdir() if p.is_dir() and p.name != "__pycache__") \
        == sorted(WINGS)


def test_no_kernels_module_over_450_lines() -> None:
    """kernels.py was 1,257 lines; each wing keeps its own compiled kernels beside it."""
    long = {str(p.relative_to(ROOT)): n for p in (ROOT / "rcdiag/analysis").rglob("*kernels.py")
            if (n := len(p.read_text().splitlines())) > 450}
    assert long == {}, long


def test_cycle_finder_on_a_known_graph() -> None:
    edges = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert cycles(edges) == [["a", "b", "c"]]


@pytest.mark.parametrize("argv", [["report", "--help"], ["import", "--help"], ["dashboard", "--help"], ["--help"]])
def test_light_commands_import_no_heavy_stack(argv: list[str]) -> None:
    """`rcdiag report --help` (and import, dashboard, the root help) load neither torch, vLLM nor transformers —
    nor numba, pandas or matplotlib (`report --help` took 0.85 s when its options' defaults loaded the kernels;
    0.34 s without): commands are imported lazily and only the one being run is loaded."""
    code = (f"import sys\nfrom rcdiag.cli import main\ntry:\n    main({argv!r})\nexcept SystemExit:\n    pass\n"
            "print(sorted(m for m in ('torch', 'vllm', 'transformers', 'numba', 'pandas', 'matplotlib', "
            "'rcdiag.commands.score', 'rcdiag.commands.probe') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120,
                         env={"COLUMNS": "100", "PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1"})
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "[]", out.stdout[-500:]
