"""The house in layers (docs/architecture.md, "Layers"): the contracts of .importlinter hold, no import
circle, function-local imports of topotrain modules only where each says why, no module over 800 lines."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import grimp
import networkx as nx
import pytest
from importlinter.cli import EXIT_STATUS_SUCCESS, lint_imports

ROOT = Path(__file__).resolve().parent.parent
SRC = ROOT / "src" / "topotrain"
#: Most function-local imports of topotrain modules the package may hold (each with a reason beside it).
MAX_LOCAL_IMPORTS = 15
#: Most lines a module of src/ may have.
MAX_MODULE_LINES = 800


def local_imports(package_dir: Path, package: str) -> list[tuple[Path, int, str, bool]]:
    """(file, line, import, has a reason) for every import of ``package`` inside a function body; the reason is
    a comment on the import's first line or on the line above it."""
    found = []
    for path in sorted(package_dir.rglob("*.py")):
        text = path.read_text(encoding="utf-8")
        lines = text.splitlines()
        seen: set[int] = set()  # an import inside a nested function is walked from each enclosing one
        for fn in ast.walk(ast.parse(text)):
            if not isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            for node in ast.walk(fn):
                if isinstance(node, ast.ImportFrom):
                    mods = [node.module or ""] if node.level == 0 else [package]
                elif isinstance(node, ast.Import):
                    mods = [a.name for a in node.names]
                else:
                    continue
                if node.lineno in seen:
                    continue
                seen.add(node.lineno)
                if any(m == package or m.startswith(package + ".") for m in mods):
                    here, above = lines[node.lineno - 1], lines[node.lineno - 2] if node.lineno > 1 else ""
                    reason = "#" in here or above.strip().startswith("#")
                    found.append((path, node.lineno, ast.unparse(node), reason))
    return found


def import_cycles(package: str) -> list[list[str]]:
    """Every circle of runtime imports among ``package``'s modules (a strongly connected component of two or
    more modules; imports under ``if TYPE_CHECKING:`` are annotations, not executed, and left out)."""
    graph = grimp.build_graph(package, exclude_type_checking_imports=True)
    g: nx.DiGraph[str] = nx.DiGraph()
    for m in graph.modules:
        for t in graph.find_modules_directly_imported_by(m):
            g.add_edge(m, t)
    return [sorted(c) for c in nx.strongly_connected_components(g) if len(c) > 1]


def test_layer_contracts_hold(capsys: pytest.CaptureFixture[str]) -> None:
    status = lint_imports(config_filename=str(ROOT / ".importlinter"), no_cache=True, no_logo=True)
    assert status == EXIT_STATUS_SUCCESS, capsys.readouterr().out


def test_no_import_circle() -> None:
    assert import_cycles("topotrain") == []


def test_function_local_imports_are_few_and_say_why() -> None:
    found = local_imports(SRC, "topotrain")
    assert len(found) <= MAX_LOCAL_IMPORTS, "\n".join(f"{p.relative_to(ROOT)}:{n} {s}" for p, n, s, _ in found)
    silent = [f"{p.relative_to(ROOT)}:{n} {s}" for p, n, s, why in found if not why]
    assert not silent, "a function-local import needs a one-line reason beside it:\n" + "\n".join(silent)


def test_no_module_over_800_lines() -> None:
    long = {str(p.relative_to(ROOT)): n for p in SRC.rglob("*.py")
            if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_MODULE_LINES}
    assert long == {}


def _toy_package(tmp_path: Path, upward: bool) -> Path:
    pkg = tmp_path / "toylayers"
    (pkg / "low").mkdir(parents=True)
    (pkg / "high").mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "high" / "__init__.py").write_text("from toylayers.low import helper\n")
    (pkg / "low" / "__init__.py").write_text("")
    body = "def helper():\n    from toylayers.high import __name__ as n\n    return n\n" if upward else "X = 1\n"
    (pkg / "low" / "helper.py").write_text(body)
    cfg = tmp_path / "toy.ini"
    cfg.write_text("[importlinter]\nroot_package = toylayers\n\n[importlinter:contract:l]\nname = toy\n"
                   "type = layers\nlayers =\n    toylayers.high\n    toylayers.low\n")
    return cfg


@pytest.mark.parametrize("upward", [False, True])
def test_the_checks_catch_an_upward_import_a_circle_and_a_silent_local_import(
        tmp_path: Path, upward: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """The checks above on a toy package: a function-local upward import breaks the layer contract, closes a
    circle and is counted without a reason; without it all three pass."""
    cfg = _toy_package(tmp_path, upward)
    monkeypatch.syspath_prepend(str(tmp_path))
    status = lint_imports(config_filename=str(cfg), no_cache=True, no_logo=True)
    assert (status == EXIT_STATUS_SUCCESS) is not upward
    assert bool(import_cycles("toylayers")) is upward
    found = local_imports(tmp_path / "toylayers", "toylayers")
    assert [why for *_, why in found] == ([False] if upward else [])
    sys.modules.pop("toylayers", None)
