"""What a signal reader takes and gives: the evaluation ``Context`` in, ``Sample`` lists out.

In:  nothing (the types and helpers every reader in ``alerts.read_*`` shares).
Out: ``Context`` (the ClickHouse client, the metadata sessions, cost weights and the cycle
     cache), ``Params`` (a signal's parsed parameters), ``Reader`` (the function a signal is),
     ``Sample`` (labels, value, extra), ``window`` (a parameter's duration as ``[start, end)``)
     and ``frame`` (a DataFrame's rows as samples).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

import pandas as pd

from storage.clickhouse import Client

if TYPE_CHECKING:
    from analytics.cost import TokenWeights

__all__ = ["Context", "Params", "Reader", "Sample", "frame", "window"]

# a signal's parameters, parsed by their kind (``alerts.signals.Param``): durations and numbers
# as floats, choices and text as strings; the reader knows which key holds which
Params = dict[str, Any]


@dataclass(frozen=True)
class Sample:
    labels: dict[str, str]
    value: float
    # facts about the value for the notification, not part of the alert's identity:
    # ``{{ $extra.NAME }}`` in annotations (e.g. a burn rate's window ``coverage``)
    extra: dict[str, float] = field(default_factory=dict)


@dataclass
class Context:
    client: Client
    sessions: Any = None  # metadata DB (SLO targets, GPU prices): a session factory
    weights: TokenWeights | None = None
    # one evaluation cycle's answers (samples, or the cycle's SignalError), keyed by what was read
    cache: dict[tuple[Any, ...], Any] = field(default_factory=dict)
    shared: bool = True  # False: every rule reads its own answer (the benchmark's reference)

    def new_cycle(self) -> None:
        self.cache.clear()


Reader = Callable[[Context, Params, datetime], list[Sample]]


def window(at: datetime, p: Params, key: str = "window") -> tuple[datetime, datetime]:
    """The ``[start, end)`` of the duration parameter ``key`` ending at ``at``."""
    return at - timedelta(seconds=p[key]), at


def frame(df: pd.DataFrame, labels: list[str], column: str) -> list[Sample]:
    """One sample per row of ``df`` with a value in ``column``, labelled by the ``labels`` columns."""
    out = []
    for row in df.itertuples(index=False):
        value = getattr(row, column)
        if value is None or pd.isna(value):
            continue
        out.append(Sample({k: str(getattr(row, k)) for k in labels}, float(value)))
    return out
