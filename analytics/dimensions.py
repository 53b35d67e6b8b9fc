"""The values the filters can take in a window: models and replicas that reported (series rows are
refreshed every 10 minutes, so one seen 15 minutes before the window counts), tenants and
routes that sent requests.

In:  a client and a window ``[start, end)``.
Out: ``dimension_values`` -> ``{"model": [...], "replica": [...], "tenant": [...], "route": [...]}``,
     each sorted (what the dashboard offers in its filter boxes).
"""

from __future__ import annotations

from datetime import datetime

from analytics.cost import UP_METRIC
from analytics.requests import request_totals
from analytics.tiers import param_time
from storage.clickhouse import Client

__all__ = ["dimension_values"]


def dimension_values(client: Client, start: datetime, end: datetime) -> dict[str, list[str]]:
    rows = client.query(
        "SELECT DISTINCT model, replica FROM series WHERE metric = {m:String} AND last_seen >= {s:DateTime64(3)} - "
        "INTERVAL 15 MINUTE "
        "AND first_seen < {e:DateTime64(3)}",
        parameters={"m": UP_METRIC, "s": param_time(start), "e": param_time(end)},
    ).result_rows
    out = {"model": sorted({m for m, _r in rows if m}), "replica": sorted({r for _m, r in rows if r})}
    for key in ("tenant", "route"):
        found = request_totals(client, start, end, by=[key], source=None)
        out[key] = sorted(v for v in found[key].tolist() if v) if key in found else []
    return out
