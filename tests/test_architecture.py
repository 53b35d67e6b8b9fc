"""The import contract: each package imports only what docs/architecture.md's table
says it may, imports inside functions and under ``TYPE_CHECKING`` included, with no exceptions
list. Data flows one way: fleet -> collector -> storage -> analytics -> {dashboard, alerts}."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = (
    "common",
    "fleet",
    "collector",
    "storage",
    "migrations",
    "analytics",
    "alerts",
    "adhoc",
    "planner",
    "exporter",
    "dashboard",
    "fleetscope",
)
# package -> the first-party packages it may import (itself always)
MAY_IMPORT: dict[str, set[str]] = {
    "common": set(),
    "fleet": {"common"},  # the system observed: nothing of the platform but the shared loader
    "collector": {"common", "storage"},
    "storage": {"common"},
    "migrations": {"common", "storage"},
    "analytics": {"common", "storage"},
    "adhoc": {"common", "storage"},
    "alerts": {"common", "storage", "analytics", "adhoc"},
    # what if: recorded traffic (analytics) through the fleet's own router and simulator (a library here)
    "planner": {"common", "storage", "analytics", "fleet"},
    # fleetscope's numbers on /metrics: analytics' figures, read in the background
    "exporter": {"common", "storage", "analytics"},
    "dashboard": {"common", "storage", "analytics", "alerts", "adhoc", "planner"},
    "fleetscope": set(PACKAGES),
}


def first_party_imports(path: Path) -> list[tuple[int, str]]:
    """(line, first-party package) of every import in the file, wherever it stands."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names = [node.module]
        elif isinstance(node, ast.ImportFrom) and node.level:  # relative: within the package
            continue
        found += [(node.lineno, name.split(".")[0]) for name in names if name.split(".")[0] in PACKAGES]
    return found


def edges() -> list[tuple[str, int, str, str]]:
    """(file, line, from package, to package) of every first-party import across packages."""
    out = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            for line, target in first_party_imports(path):
                if target != package:
                    out.append((str(path.relative_to(ROOT)), line, package, target))
    return out


def test_every_package_imports_only_what_it_may() -> None:
    wrong = [
        f"{file}:{line}: {source} imports {target} (it may import: {', '.join(sorted(MAY_IMPORT[source])) or 'nothing'})"
        for file, line, source, target in edges()
        if target not in MAY_IMPORT[source]
    ]
    assert not wrong, "\n".join(wrong)


def test_the_contract_covers_every_package_and_the_documented_table() -> None:
    on_disk = {p.name for p in ROOT.iterdir() if (p / "__init__.py").exists()} - {"tests", "bench"}
    assert on_disk == set(PACKAGES), "a package the contract does not know: add it to MAY_IMPORT and the docs"
    table = (ROOT / "docs" / "architecture.md").read_text()
    for package, allowed in MAY_IMPORT.items():
        row = next((line for line in table.splitlines() if line.startswith(f"| `{package}/`")), None)
        assert row is not None, f"docs/architecture.md has no row for {package}/"
        may = row.split("|")[3]
        named = {p for p in PACKAGES if f"`{p}`" in may}
        assert named == (allowed if package != "fleetscope" else named), (package, named, allowed)


@pytest.mark.parametrize(
    "source",
    [
        "def f():\n    from dashboard.view import read_view\n",
        "import typing\nif typing.TYPE_CHECKING:\n    import fleetscope.settings\n",
        "import fleetscope\n",
    ],
)
def test_an_upward_import_is_seen_wherever_it_stands(tmp_path: Path, source: str) -> None:
    path = tmp_path / "planted.py"
    path.write_text(source)
    assert {target for _line, target in first_party_imports(path)} & {"dashboard", "fleetscope"}
