"""The frames the analytics read and sum: ``arrow_df`` is ``query_df``'s frame (the columns a page
formats and merges keep their types), and ``sum_by`` is pandas' ``groupby().sum()`` (the
showback's rows, their order, a missing key, integer counts), ``sort_by`` is ``sort_values``
on a ``GROUP BY``'s rows."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from analytics.frames import arrow_df, arrow_frame, query_df, sort_by, sum_by

ROWS = """
    SELECT toDateTime64('2026-12-01 10:00:00', 3, 'UTC') + INTERVAL (number % 3) HOUR AS step_ts,
           toLowCardinality(['acme', 'globex', 'initech'][number % 3 + 1]) AS tenant,
           if(number % 4 = 0, 'pinned', 'routed') AS route, toUInt64(number) AS rows, number * 0.5 AS tokens
    FROM numbers({n:UInt32})"""


@pytest.mark.parametrize("n", [12, 0])
def test_arrow_df_is_query_dfs_frame(ch, n) -> None:
    via_arrow = arrow_df(ch, ROWS, parameters={"n": n})
    assert list(via_arrow.columns) == ["step_ts", "tenant", "route", "rows", "tokens"]
    assert len(via_arrow) == n
    if n:  # the frame clickhouse-connect gives, types included (strings as its Arrow-backed strings)
        pd.testing.assert_frame_equal(via_arrow, query_df(ch, ROWS, parameters={"n": n}))
    else:  # no rows: the columns keep their types (query_df's frame has no types to give then)
        assert str(via_arrow["step_ts"].dtype) == "datetime64[ms, UTC]" and via_arrow["rows"].dtype == np.uint64


def test_strings_sent_as_binary_read_as_strings(ch) -> None:
    # what a server sends a user that may not set output_format_arrow_string_as_string (readonly)
    binary = ch.query_arrow(ROWS, parameters={"n": 12}, use_strings=False)
    assert str(binary.schema.field("tenant").type) == "binary"
    pd.testing.assert_frame_equal(arrow_frame(binary), query_df(ch, ROWS, parameters={"n": 12}))


@pytest.mark.filterwarnings("ignore:invalid value encountered in reduceat:RuntimeWarning")  # pandas' inf + -inf
def test_sum_by_is_groupbys_sum() -> None:
    df = pd.DataFrame(
        {
            "pool": pd.array(["b", "a", "b", None, "a", "b"], dtype=pd.StringDtype("pyarrow")),
            "tenant": pd.array(["x", "y", "x", "x", "y", "z"], dtype=pd.StringDtype("pyarrow")),
            "requests": np.array([1, 2, 3, 4, 5, 6], dtype=np.int64),
            "spend": [0.5, np.nan, 1.5, 2.0, 0.25, 1.0],
        }
    )
    expected = df.groupby(["pool", "tenant"], as_index=False, dropna=False)[["requests", "spend"]].sum()
    summed = sum_by(df, ["pool", "tenant"], ["requests", "spend"])
    pd.testing.assert_frame_equal(summed, expected)
    # a missing pool is a group of its own, last; NaN spend counts as nothing; counts stay integers
    assert summed["pool"].isna().tolist() == [False, False, False, True]
    assert summed["spend"].tolist() == [0.25, 2.0, 1.0, 2.0] and summed["requests"].dtype == np.int64
    # infinities kept (inf + -inf is NaN, as pandas has it), booleans counted
    odd = pd.DataFrame({"k": ["a", "a", "b"], "x": [np.inf, -np.inf, 1.0], "flag": [True, True, False]})
    pd.testing.assert_frame_equal(
        sum_by(odd, ["k"], ["x", "flag"]), odd.groupby("k", as_index=False)[["x", "flag"]].sum()
    )
    assert np.isnan(sum_by(odd, ["k"], ["x"])["x"][0]) and sum_by(odd, ["k"], ["flag"])["flag"].tolist() == [2, 0]
    empty = sum_by(df.iloc[:0], ["pool"], ["spend"])
    assert empty.empty and list(empty.columns) == ["pool", "spend"]


def test_sort_by_is_sort_values_on_a_group_bys_rows() -> None:
    df = pd.DataFrame(
        {
            "ts": pd.to_datetime([3, 1, 1, 2, 1], unit="h", utc=True),
            "tenant": pd.array(["b", None, "a", "a", "b"], dtype=pd.StringDtype("pyarrow")),
            "requests": [1.0, 2.0, 3.0, 4.0, 5.0],
        }
    )
    ordered = sort_by(df, ["ts", "tenant"])
    pd.testing.assert_frame_equal(ordered, df.sort_values(["ts", "tenant"], ignore_index=True))
    # by time, then tenant, the missing tenant last within its hour
    assert ordered["requests"].tolist() == [3.0, 5.0, 2.0, 4.0, 1.0]
