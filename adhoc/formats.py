"""Query results -> the formats ``fleetscope sql`` writes: table, CSV, JSON, Parquet.

In:  an ``adhoc.runner.Result`` (column names, ClickHouse types, rows, truncated).
Out: ``render(result, fmt)`` -> bytes. ``table`` is aligned text for a terminal with a footer
     (rows, time, and whether the row limit cut the result); ``csv`` has a header row (RFC 4180
     quoting); ``json`` is ``{"columns": [{"name", "type"}], "rows": [{column: value}],
     "row_count", "truncated", "elapsed_s"}``; ``parquet`` is one Parquet file (pyarrow).
     Times are ISO 8601 in UTC; NaN and infinities are JSON ``null``; bytes are text.
"""

from __future__ import annotations

import csv
import io
import json
import math
from datetime import date, datetime
from decimal import Decimal
from typing import Any
from uuid import UUID

from adhoc.runner import Result

__all__ = ["FORMATS", "jsonable", "render"]

FORMATS = ("table", "csv", "json", "parquet")


def jsonable(value: Any) -> Any:
    """A cell as JSON: times as ISO 8601, NaN/inf as null, containers recursively."""
    if isinstance(value, float):
        return None if math.isnan(value) or math.isinf(value) else value
    if isinstance(value, datetime | date):
        return value.isoformat()
    if isinstance(value, Decimal | UUID):
        return str(value)
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    if value is None or isinstance(value, bool | int | str):
        return value
    return str(value)  # IP addresses and other ClickHouse types: their text


def _text(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e15:
        return repr(value)
    if isinstance(value, datetime | date):
        return value.isoformat()
    if isinstance(value, dict | list | tuple):
        return json.dumps(jsonable(value), ensure_ascii=False)
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return str(value)


def _footer(result: Result) -> str:
    n = len(result.rows)
    cut = f", cut at the row limit ({n:,}): add LIMIT or raise --limit" if result.truncated else ""
    return f"({n:,} row{'s' if n != 1 else ''}, {result.elapsed_s:.3f} s{cut})"


def unique_names(names: list[str]) -> list[str]:
    """Column names made unique (``n``, ``n_2``, ...): JSON objects and Parquet need them so."""
    seen: dict[str, int] = {}
    out = []
    for name in names:
        seen[name] = seen.get(name, 0) + 1
        out.append(name if seen[name] == 1 else f"{name}_{seen[name]}")
    return out


def render(result: Result, fmt: str, *, max_width: int = 60) -> bytes:
    if fmt == "csv":
        out = io.StringIO()
        writer = csv.writer(out, lineterminator="\n")
        writer.writerow(result.columns)
        writer.writerows([_text(v) for v in row] for row in result.rows)
        return out.getvalue().encode()
    if fmt == "json":
        names = unique_names(result.columns)
        body = {
            "columns": [{"name": n, "type": t} for n, t in zip(names, result.types, strict=True)],
            "rows": [{n: jsonable(v) for n, v in zip(names, row, strict=True)} for row in result.rows],
            "row_count": len(result.rows),
            "truncated": result.truncated,
            "elapsed_s": round(result.elapsed_s, 6),
        }
        return (json.dumps(body, ensure_ascii=False) + "\n").encode()
    if fmt == "parquet":
        import pandas as pd
        import pyarrow as pa
        import pyarrow.parquet as pq

        frame = pd.DataFrame(result.rows, columns=unique_names(result.columns))
        for column in frame.columns:  # types Arrow has no mapping for (IP addresses, ...): their text
            if (
                frame[column].dtype == object
                and not frame[column]
                .map(lambda v: v is None or isinstance(v, str | bytes | int | float | bool | datetime | date))
                .all()
            ):
                frame[column] = frame[column].map(lambda v: None if v is None else str(jsonable(v)))
        table = pa.Table.from_pandas(frame, preserve_index=False)
        sink = io.BytesIO()
        pq.write_table(table, sink)
        return sink.getvalue()
    if fmt != "table":
        raise ValueError(f"format must be one of {', '.join(FORMATS)}, not {fmt!r}")
    cells = [[_text(v) for v in row] for row in result.rows]
    cells = [[c if len(c) <= max_width else c[: max_width - 1] + "…" for c in row] for row in cells]
    widths = [max([len(name)] + [len(row[i]) for row in cells]) for i, name in enumerate(result.columns)]
    numeric = [t.removeprefix("Nullable(").startswith(("Int", "UInt", "Float", "Decimal")) for t in result.types]
    lines = [
        " | ".join(n.ljust(w) for n, w in zip(result.columns, widths, strict=True)),
        "-+-".join("-" * w for w in widths),
    ]
    for row in cells:
        lines.append(
            " | ".join(c.rjust(w) if num else c.ljust(w) for c, w, num in zip(row, widths, numeric, strict=True))
        )
    lines.append(_footer(result))
    return ("\n".join(line.rstrip() for line in lines) + "\n").encode()
