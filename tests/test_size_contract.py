"""The size contract, beside the import contract: no product module over 600 lines, no function
over 80 lines except the few that docs/architecture.md ("Size") names with a reason, at most
five. A long module or function is where several jobs hide; the contract makes adding one a
decision written down, not a drift. ``bench/`` and ``tests/`` are not product code."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from tests.test_architecture import PACKAGES, ROOT

MODULE_LINES = 600
FUNCTION_LINES = 80
MOST_EXCEPTIONS = 5


def modules() -> list[Path]:
    return sorted(p for package in PACKAGES for p in (ROOT / package).rglob("*.py"))


def long_functions(path: Path, limit: int = FUNCTION_LINES) -> dict[str, int]:
    """``qualified name -> lines`` (decorators aside, ``def`` to the last line) of the functions
    in ``path`` longer than ``limit``."""
    found: dict[str, int] = {}

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                name = f"{prefix}{child.name}"
                if not isinstance(child, ast.ClassDef):
                    lines = (child.end_lineno or child.lineno) - child.lineno + 1
                    if lines > limit:
                        found[name] = lines
                visit(child, f"{name}.")

    visit(ast.parse(path.read_text(), str(path)), "")
    return found


def documented_exceptions(text: str) -> dict[str, str]:
    """``"path:function" -> reason`` from the table under "## Size" in docs/architecture.md
    (rows ``| `path` | `function` | reason |``)."""
    assert "\n## Size" in text, 'docs/architecture.md has no "## Size" section'
    section = text.split("\n## Size", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| `([^`]+\.py)` \| `([^`]+)` \| (.+?) \|$", section, flags=re.M)
    return {f"{path}:{function}": reason.strip() for path, function, reason in rows}


def test_no_product_module_is_over_600_lines() -> None:
    long = {str(p.relative_to(ROOT)): n for p in modules() if (n := len(p.read_text().splitlines())) > MODULE_LINES}
    assert not long, f"modules over {MODULE_LINES} lines (split them by job): {long}"


def test_no_function_is_over_80_lines_but_the_documented_few() -> None:
    allowed = documented_exceptions((ROOT / "docs" / "architecture.md").read_text())
    assert len(allowed) <= MOST_EXCEPTIONS, f"docs/architecture.md names {len(allowed)} long functions: at most five"
    assert all(len(reason) >= 20 for reason in allowed.values()), "each exception says why"
    found = {f"{p.relative_to(ROOT)}:{name}": lines for p in modules() for name, lines in long_functions(p).items()}
    undocumented = {k: v for k, v in found.items() if k not in allowed}
    assert not undocumented, f"functions over {FUNCTION_LINES} lines, not named in docs/architecture.md: {undocumented}"
    stale = sorted(set(allowed) - set(found))
    assert not stale, f"docs/architecture.md names as long what no longer is (remove the rows): {stale}"


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("def f():\n" + "    x = 1\n" * 80, {"f": 81}),
        ("class C:\n    async def g(self):\n" + "        pass\n" * 81, {"C.g": 82}),
        ("def f():\n    def inner():\n" + "        pass\n" * 10 + "    return inner\n", {}),
    ],
)
def test_a_long_function_is_seen_wherever_it_stands(tmp_path: Path, source: str, expected: dict[str, int]) -> None:
    path = tmp_path / "planted.py"
    path.write_text(source)
    assert long_functions(path) == expected


def test_the_documented_table_is_read() -> None:
    text = "# A\n\n## Size\n\n| module | function | why |\n|---|---|---|\n| `fleet/x.py` | `C.f` | a literal config, read as one |\n\n## Next\n"
    assert documented_exceptions(text) == {"fleet/x.py:C.f": "a literal config, read as one"}
