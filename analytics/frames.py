"""Query results as DataFrames that keep their columns when no row matched.

In:  a client, SQL, parameters and settings (as ``client.query_df`` takes them).
Out: the result DataFrame; an empty result still has the query's columns (clickhouse-connect
     returns a frame without columns then, on chDB), so callers can select and merge without a
     special case for empty windows.
"""

from __future__ import annotations

from typing import Any

import pandas as pd

__all__ = ["query_df"]


def query_df(
    client: Any, sql: str, parameters: dict[str, Any] | None = None, settings: dict[str, Any] | None = None
) -> pd.DataFrame:
    df: pd.DataFrame = client.query_df(sql, parameters=parameters, settings=settings)
    if df.empty and not len(df.columns):  # the embedded store names no columns for no rows: ask for them
        rows = client.query(f"DESCRIBE ({sql})", parameters=parameters, settings=settings).result_rows
        df = pd.DataFrame(columns=[row[0] for row in rows])
    return df
