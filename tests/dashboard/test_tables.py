"""Every table and chart on every page reads like a product: no header, legend title or legend entry
is a raw snake_case identifier and no cell holds a float with more than 4 significant digits or
nothing at all, which Streamlit prints "None" (under AppTest a table is the frame the page
hands ``st.dataframe``; what its cells hold is what they print, formatted). Walked on a simulated run
(tenant-shift, with test_pages' alert history), each page's optional tables opened. The SQL page's
result table, the user's own query headed with the names the user gave, is not walked (no query runs).

The checks live here, not in the pages: a page that bypasses ``dashboard.format`` fails them."""

from __future__ import annotations

import json
import math
import re
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from dashboard.context import use_stores
from tests.analytics.scenario_data import play
from tests.conftest import migrated_sessions
from tests.dashboard.apptest import PAGES, on_store, run, seed_alerts, window

SNAKE = re.compile(r"^[a-z][a-z0-9]*(_[a-z0-9]+)+$")  # kv_avg, cost_per_million_tokens


@pytest.fixture(scope="module")
def shift(chdb_dir):
    return play(chdb_dir, "tenant-shift", seed=1)


@pytest.fixture
def sessions(sqlite_url: str):
    yield from migrated_sessions(sqlite_url)


def headers(table: Any) -> list[str]:
    """The headers the table shows: a column's label from its column config, else its name."""
    config = json.loads(table.proto.columns) if table.proto.columns else {}
    return [str((config.get(str(name)) or {}).get("label") or name) for name in table.value.columns]


def significant(value: float) -> int:
    """How many significant digits the shortest text of ``value`` has (12.35 -> 4, 0.0533 -> 3)."""
    digits = repr(float(value)).lower().split("e")[0].replace("-", "").replace(".", "").lstrip("0")
    return len(digits.rstrip("0")) if "." in repr(float(value)) else len(digits)


def test_significant_digits_are_counted_as_a_reader_counts_them() -> None:
    assert [significant(v) for v in (12.35, 0.0533, 1857424.0, 0.01600000075995922, 2.0, 38.09)] == [4, 3, 7, 16, 1, 4]


def unreadable(table: Any) -> list[str]:
    problems = [f"header {h!r}" for h in headers(table) if SNAKE.match(h)]
    frame = table.value
    for name in frame.columns:
        column = frame[name]
        if column.isna().any():  # Streamlit prints an empty cell "None", not the page's "–"
            problems.append(f"{name!r} has an empty cell, which prints 'None'")
        if column.dtype.kind != "f" and column.dtype != object:
            continue
        for value in column:
            if isinstance(value, float | np.floating) and math.isfinite(value) and significant(value) > 4:
                problems.append(f"{name!r} holds {value!r}")
                break
    return problems


LEGENDS = ("color", "fill", "stroke", "strokeDash", "shape", "opacity", "size")


def encodings(spec: Any) -> list[dict[str, Any]]:
    """Every ``encoding`` of a Vega-Lite spec, layers and facets included."""
    found: list[dict[str, Any]] = []
    if isinstance(spec, dict):
        if isinstance(spec.get("encoding"), dict):
            found.append(spec["encoding"])
        for value in spec.values():
            found += encodings(value)
    elif isinstance(spec, list):
        for value in spec:
            found += encodings(value)
    return found


def raw_legends(chart: Any) -> list[str]:
    """Legends a reader would see a raw column name in: a legend titled with one, or an entry that is one
    (``busy_spend`` where the page meant "busy")."""
    spec = json.loads(chart.proto.spec)
    frames = [pa.ipc.open_stream(d.data.data).read_all().to_pandas() for d in chart.proto.datasets if d.data.data]
    problems = []
    for encoding in encodings(spec):
        for channel in LEGENDS:
            enc = encoding.get(channel)
            if not isinstance(enc, dict) or "field" not in enc or enc.get("legend", {}) is None:
                continue
            field, title = str(enc["field"]), enc.get("title", enc["field"])
            if isinstance(title, str) and SNAKE.match(title):
                problems.append(f"{channel} legend titled {title!r}")
            if enc.get("type") == "nominal":
                values = {str(v) for f in frames if field in f.columns for v in f[field].dropna().unique()}
                problems += [f"{channel} legend entry {v!r}" for v in sorted(values) if SNAKE.match(v)]
    return problems


def walk(at: Any, page: str, seen: dict[str, list[str]]) -> None:
    assert not at.exception, (page, at.exception)
    for i, table in enumerate(at.dataframe):
        for problem in unreadable(table):
            seen.setdefault(page, []).append(f"table {i} ({', '.join(headers(table))[:80]}): {problem}")
    for i, chart in enumerate(at.get("vega_lite_chart")):
        for problem in raw_legends(chart):
            seen.setdefault(page, []).append(f"chart {i}: {problem}")


def test_every_table_and_legend_on_every_page_reads_like_a_product(shift, sessions, chdb_dir) -> None:
    seed_alerts(shift.client, sessions)
    use_stores(shift.client, sessions, on_store(chdb_dir))
    seen: dict[str, list[str]] = {}
    tables = charts = 0
    for page in PAGES:
        at = run(page, **window(shift))
        walk(at, page, seen)
        tables += len(at.dataframe)
        charts += len(at.get("vega_lite_chart"))
        for toggle in at.toggle:  # the optional tables (Investigate's cost of the two periods, ...)
            at = toggle.set_value(True).run()
            walk(at, page, seen)
        for button in at.button:  # a form's answer (the Plan page's replay)
            if button.label == "Replay":
                at = button.click().run(timeout=180)
                walk(at, page, seen)
                tables += len(at.dataframe)
    for params in ({"metric": "cost", "tenant": "globex"}, {"metric": "itl"}):
        at = run("investigate", **window(shift), **params)
        walk(at, "investigate", seen)
        tables += len(at.dataframe)
    at = run("alerts", range="1h")
    walk(at, "alerts", seen)
    tables += len(at.dataframe)
    assert tables >= 15  # the walk reached the tables it checks
    assert charts >= 15
    assert not seen, "\n".join(f"{page}: {p}" for page, found in seen.items() for p in found)
