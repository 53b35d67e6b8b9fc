"""``dashboard.format``: each kind of cell as a person reads it, and a table's headers and values."""

from __future__ import annotations

import pandas as pd
import pytest

from dashboard.format import cell, label, sig, table


@pytest.mark.parametrize(
    ("value", "kind", "shown"),
    [
        (0.38091, "percent", "38.1%"),
        (1.0, "percent", "100%"),
        (1234.567, "usd", "$1,235"),
        (12.345, "usd", "$12.35"),
        (0.053312, "usd", "$0.0533"),
        (-0.2, "signed_usd", "-$0.200"),
        (0.2, "signed_usd", "+$0.200"),
        (1857424.0, "count", "1,857,424"),
        (9.0, "number", "9"),
        (0.79634, "number", "0.796"),
        (0.01234, "seconds", "12.3 ms"),
        (2.0991, "seconds", "2.10 s"),
        (600.0, "seconds", "10.0 min"),
        (0.0122, "rate", "0.0122/s"),
        (True, "yes/no", "yes"),
        (pd.Timestamp("2026-12-01 07:30:05", tz="UTC"), "time", "07:30:05"),
        (float("nan"), "usd", "–"),
        (None, "percent", "–"),
    ],
)
def test_each_kind_prints_as_a_person_reads_it(value, kind, shown) -> None:
    assert cell(value, kind) == shown


def test_a_table_heads_columns_with_labels_and_holds_four_significant_digits() -> None:
    df = pd.DataFrame(
        {
            "model": ["tiny-small", "(fleet)"],
            "cost_per_million_tokens": [0.26323601742551994, float("nan")],
            "prompt_tokens": [101790.0, 20095.0],
            "busy_spend": [0.009990333333333334, 1234.5678],
            "some_new_share": [0.5348837209302325, 0.1],
        }
    )
    styled = table(df)
    out = styled.data
    assert list(out.columns) == ["Model", "Cost per 1M tokens ($)", "Prompt tokens", "Busy spend ($)", "Some new share"]
    # a column with an empty cell is printed into text ("–" there): Streamlit would print "None"
    assert list(out["Cost per 1M tokens ($)"]) == ["$0.263", "–"]
    assert list(out["Prompt tokens"]) == [101790, 20095] and str(out["Prompt tokens"].dtype) == "Int64"
    assert list(out["Busy spend ($)"]) == [0.00999, 1235.0]
    html = styled.to_html()
    assert "$1,235" in html and "53.5%" in html and "–" in html and "101,790" in html  # by its name's suffix
    assert label("kv_avg") == "KV cache used (avg)" and label("q_before") == "Quantile before"
    assert sig(0.01600000075995922) == 0.016 and sig(0) == 0 and sig("x") == "x"


def test_a_time_axis_ticks_whole_minutes_so_no_label_repeats() -> None:
    # a 15-minute window ticked every 30 s printed 07:27 07:27 07:28 (labels read HH:MM)
    from datetime import UTC, datetime, timedelta

    from dashboard.marks import tick_minutes, time_x
    from dashboard.view import read_view

    assert [tick_minutes(s) for s in (900, 3600, 6 * 3600, 86400)] == [1, 5, 30, 120]
    end = datetime(2026, 12, 1, 8, tzinfo=UTC)
    axis = time_x(read_view({"from": (end - timedelta(minutes=15)).isoformat(), "to": end.isoformat()})).to_dict()
    assert axis["axis"]["tickMinStep"] == 60_000 and axis["axis"]["format"] == "%H:%M"  # ms on a time scale
    week = time_x(read_view({"range": "7d"})).to_dict()["axis"]
    assert "tickMinStep" not in week and week["format"] == "%m-%d %H:%M"  # past a day: the date, Vega's ticks
    # that Vega draws it (a spec it cannot draw leaves the chart blank): tests/dashboard/test_browser.py
