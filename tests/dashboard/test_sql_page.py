"""The SQL page under AppTest: it runs a query as the read-only runner does, refuses a write and
says why, saves, loads and deletes queries, and lists the tables and their columns."""

from __future__ import annotations

import csv
import io
from datetime import UTC, datetime

import pytest
from streamlit.testing.v1 import AppTest

from adhoc.runner import ReadOnlyRunner
from adhoc.saved import save_query, saved_queries
from dashboard.context import use_stores
from migrations import clickhouse_runner
from tests.dashboard.apptest import on_store, run, window

PER_MINUTE = (
    "SELECT toStartOfMinute(ts) AS minute, model, count() AS n FROM requests GROUP BY minute, model "
    "ORDER BY minute, model"
)


@pytest.fixture
def media(monkeypatch):
    """The files AppTest's runs hand to download buttons (its media store is dropped after each run)."""
    from streamlit.runtime.memory_media_file_storage import MemoryMediaFileStorage
    from streamlit.testing.v1 import app_test

    stores: list[MemoryMediaFileStorage] = []

    class Kept(MemoryMediaFileStorage):
        def __init__(self, endpoint: str) -> None:
            super().__init__(endpoint)
            stores.append(self)

    monkeypatch.setattr(app_test, "MemoryMediaFileStorage", Kept)

    def read(url: str) -> bytes:
        return stores[-1].get_file(url.rsplit("/", 1)[-1]).content

    return read


def run_sql(at: AppTest, sql: str, **widgets: object) -> AppTest:
    at.text_area(key="sql_text").input(sql)
    for key, value in widgets.items():
        at.number_input(key=key).set_value(value)
    return next(b for b in at.get("form_submit_button") if b.label == "Run").click().run()


def test_sql_page_runs_a_query_as_the_runner_does(shift, sessions, chdb_dir, media) -> None:
    use_stores(shift.client, sessions, on_store(chdb_dir))
    at = run("sql", **window(shift))
    assert not at.exception and not at.error, [e.value for e in at.error]
    assert "toStartOfHour(ts)" in at.text_area(key="sql_text").value  # the example query, run on the first render
    at = run_sql(at, PER_MINUTE)
    assert not at.exception and not at.error, [e.value for e in at.error]
    expected = ReadOnlyRunner(f"chdb:{chdb_dir}", database=shift.client.database).run(PER_MINUTE, max_rows=1000)
    assert expected.rows and not expected.truncated
    [table] = [t.value for t in at.dataframe if "minute" in t.value.columns]
    assert list(table.columns) == ["minute", "model", "n"]
    assert [tuple(r) for r in table.itertuples(index=False)] == expected.rows  # the value the user sees
    assert any(c.value.startswith(f"{len(expected.rows):,} rows in ") and c.value.endswith(" ms") for c in at.caption)
    charts = at.get("vega_lite_chart")
    assert charts and all('"temporal"' in c.proto.spec and '"utc"' in c.proto.spec for c in charts)
    [download] = [b for b in at.get("download_button") if b.label == "Download CSV"]
    lines = list(csv.reader(io.StringIO(media(download.proto.url).decode())))
    assert lines[0] == ["minute", "model", "n"] and len(lines) - 1 == len(expected.rows)
    assert at.query_params["q"] == PER_MINUTE  # the query is in the link, to send

    # the row limit cuts the result, and says so
    at = run_sql(at, PER_MINUTE, sql_limit=3)
    assert [len(t.value) for t in at.dataframe if "minute" in t.value.columns] == [3]
    assert any("cut at the row limit (3)" in c.value for c in at.caption)


def test_sql_page_refuses_a_write_and_says_why(ch, sessions, chdb_dir) -> None:
    clickhouse_runner.apply(ch)
    ch.insert("requests", [[datetime.now(UTC), "tiny-small"]], column_names=["ts", "model"])
    use_stores(ch, sessions, on_store(chdb_dir))
    at = run_sql(run("sql", range="1h"), "DROP TABLE requests")
    assert not at.exception
    [error] = [e.value for e in at.error]
    assert error.startswith("Refused:") and "DROP" in error
    assert ch.query("SELECT count() FROM requests").result_rows == [(1,)]  # still there, row and all
    at = run_sql(at, "SELECT no_such_column FROM requests")
    assert at.error and at.error[0].value.startswith("The query failed:") and "no_such_column" in at.error[0].value


def test_sql_page_saves_loads_and_deletes_queries(ch, sessions, chdb_dir) -> None:
    clickhouse_runner.apply(ch)
    save_query(
        sessions,
        "hourly",
        "SELECT toStartOfHour(ts) AS hour, count() AS n FROM requests GROUP BY hour",
        "requests per hour",
        "bo",
    )  # elsewhere, e.g. by another user
    use_stores(ch, sessions, on_store(chdb_dir))
    at = run("sql", range="1h")
    assert not at.exception
    assert at.selectbox(key="sql_saved").options == ["hourly"]
    at.text_area(key="sql_text").input(PER_MINUTE)
    at.text_input(key="sql_save_name").input("per minute")
    at.text_input(key="sql_save_description").input("requests per minute by model")
    at.text_input(key="sql_save_author").input("ana")
    at = next(b for b in at.get("form_submit_button") if b.label == "Save query").click().run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    kept = next(q for q in saved_queries(sessions) if q.name == "per minute")
    assert (kept.name, kept.sql, kept.description, kept.created_by) == (
        "per minute",
        PER_MINUTE,
        "requests per minute by model",
        "ana",
    )
    assert at.success and "per minute" in at.success[0].value
    assert at.selectbox(key="sql_saved").value == "per minute"
    assert at.text_input(key="sql_save_name").value == ""  # the form is ready for the next one

    # a statement the check refuses is not kept
    at.text_area(key="sql_text").input("DELETE FROM requests WHERE 1")
    at.text_input(key="sql_save_name").input("wipe")
    at = next(b for b in at.get("form_submit_button") if b.label == "Save query").click().run()
    assert not at.exception
    assert at.error and at.error[0].value.startswith("Not saved:")
    assert [q.name for q in saved_queries(sessions)] == ["hourly", "per minute"]

    # loading one puts its text in the editor, runs it and shows its description
    at = at.selectbox(key="sql_saved").set_value("hourly").run()
    assert not at.exception and not at.error
    assert at.text_area(key="sql_text").value.startswith("SELECT toStartOfHour(ts) AS hour, count() AS n")
    assert any(c.value.startswith("requests per hour — bo") for c in at.caption)

    at = at.button(key="sql_delete").click().run()
    assert not at.exception and not at.error
    assert [q.name for q in saved_queries(sessions)] == ["per minute"]
    assert "Deleted" in at.success[0].value and at.selectbox(key="sql_saved").value is None


def test_sql_page_lists_the_tables_and_their_columns(ch, sessions, chdb_dir) -> None:
    clickhouse_runner.apply(ch)
    use_stores(ch, sessions, on_store(chdb_dir))
    at = run("sql", range="1h")
    assert not at.exception
    requests = next(e for e in at.expander if e.label.startswith("**requests** ·"))
    [text] = [m.value for m in requests.markdown]
    head, rule, *rows = text.splitlines()
    assert head == "| Column | Type | Comment |"
    cells = {row.split(" | ")[0].strip("| ").replace("\\", ""): row.split(" | ")[1] for row in rows}
    assert {"ts", "model", "tenant"} <= set(cells)
    assert cells["ts"].startswith("DateTime") and "'UTC'" in cells["ts"]
