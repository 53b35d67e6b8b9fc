"""The dashboard's launcher imports what the pages import before the first viewer arrives."""

from __future__ import annotations

import sys
from pathlib import Path

from dashboard.launch import page_imports, preload


def test_the_pages_imports_are_found_and_loaded(tmp_path: Path) -> None:
    found = page_imports()
    assert "analytics.drift" in found and "altair" in found  # the Traffic page's slow import, charts
    assert not any(name.startswith(("dashboard", "streamlit")) for name in found)
    page = tmp_path / "page.py"
    page.write_text(
        "import json\nfrom analytics.cost import cost_per_token\ndef f():\n    import no_such_module_xyz\n"
        "from . import sibling\n"
    )
    assert page_imports([page]) == ["analytics.cost", "json", "no_such_module_xyz"]
    done, _seconds, failed = preload(["json", "no_such_module_xyz"])
    assert done == 1 and "json" in sys.modules
    assert list(failed) == ["no_such_module_xyz"] and "ModuleNotFoundError" in failed["no_such_module_xyz"]
