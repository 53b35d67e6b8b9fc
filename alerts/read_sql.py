"""A rule's own SQL: a ClickHouse ``SELECT`` run read-only, its rows as samples.

In:  a ``Context`` (the ClickHouse client), the rule's SQL text (``{eval_time:DateTime64(3)}``
     is the evaluation time) and the evaluation time.
Out: one ``Sample`` per row (the ``value`` column; every other column a label; NaN values
     left out), or ``SignalError`` naming what went wrong: the statement check refused it,
     ClickHouse did, it returned too many rows, no ``value`` column, or a value not a number.
"""

from __future__ import annotations

import math
from datetime import datetime

from adhoc.guard import Refused, check
from adhoc.runner import Limits
from alerts.errors import SignalError
from alerts.reading import Context, Sample

__all__ = ["RULE_LIMITS", "query"]

# what a rule's SQL may take: ad-hoc SQL's read-only settings (adhoc.runner.Limits) with a rule's budget
RULE_LIMITS = Limits(timeout_s=10, max_rows=10_000)


def query(ctx: Context, text: str, at: datetime) -> list[Sample]:
    """A rule's SQL, checked as ad-hoc SQL is (``adhoc.guard``) and run with its read-only
    settings (``readonly=1``, time, rows and memory: ``RULE_LIMITS``) on the shared client."""
    try:
        sql = check(text).sql
    except Refused as exc:
        raise SignalError(f"the rule's SQL is refused: {exc}") from None
    params = {"eval_time": at.replace(tzinfo=None).isoformat(timespec="milliseconds")} if "{eval_time" in text else None
    try:
        result = ctx.client.query(sql, parameters=params, settings=RULE_LIMITS.settings())
    except Exception as exc:  # noqa: BLE001 - ClickHouse's refusal, timeout, memory limit, bad SQL: said as is
        raise SignalError(f"SQL failed: {str(exc).strip().splitlines()[0][:300]}") from None
    if len(result.result_rows) > RULE_LIMITS.max_rows:
        raise SignalError(f"the SQL returns more than {RULE_LIMITS.max_rows:,} rows: aggregate it")
    names = list(result.column_names)
    if "value" not in names:
        raise SignalError(
            f"the SQL returns no `value` column (columns: {', '.join(names) or 'none'}); "
            "alias the number to check as value"
        )
    out = []
    i = names.index("value")
    for row in result.result_rows:
        v = row[i]
        try:
            value = float(v)
        except (TypeError, ValueError):
            raise SignalError(f"the SQL's value is not a number: {v!r}") from None
        if math.isnan(value):
            continue
        out.append(Sample({n: str(row[j]) for j, n in enumerate(names) if j != i}, value))
    return out
