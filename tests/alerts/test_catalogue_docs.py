"""docs/alerts.md's table of built-in signals names exactly the signals of the catalogue."""

from __future__ import annotations

import re
from pathlib import Path

from alerts.signals import SIGNALS

DOC = Path(__file__).resolve().parents[2] / "docs" / "alerts.md"


def documented_signals(text: str) -> set[str]:
    """The signal names in the first column of the table under ``### Built-in signals``."""
    lines = text.split("### Built-in signals", 1)[1].splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("|"))
    rows = []
    for line in lines[start:]:
        if not line.startswith("|"):
            break
        rows.append(line)
    names: set[str] = set()
    for row in rows[2:]:  # the header and the |---| line
        first = row.strip("|").split("|", 1)[0]
        names.update(re.findall(r"`([a-z][a-z0-9_]*)`", first))
    return names


def test_the_signal_table_names_every_signal_of_the_catalogue_and_no_other() -> None:
    documented = documented_signals(DOC.read_text())
    assert documented, "no signal table found under '### Built-in signals' in docs/alerts.md"
    missing = set(SIGNALS) - documented
    unknown = documented - set(SIGNALS)
    assert not missing, f"signals in alerts.signals.SIGNALS missing from docs/alerts.md: {sorted(missing)}"
    assert not unknown, f"docs/alerts.md names signals the catalogue does not have: {sorted(unknown)}"
