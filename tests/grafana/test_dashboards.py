"""The shipped Grafana dashboards (``grafana/*.json``) show the Streamlit dashboard's numbers.

In:  every dashboard JSON in ``grafana/``; chDB stores with scenarios played on the bundled fleet
     (``tests.analytics.scenario_data.play``: simulated engines and gateway through the collector's
     own parser and writer).
Out: assertions that each dashboard is well formed for Grafana's ClickHouse data source (module
     ``check_dashboard``); that every panel's SQL, expanded as the plugin expands it
     (``tests.grafana.macros``), runs and returns rows; and that each panel's numbers equal what the
     analytics call of its Streamlit page returns on the same store, window, step and model choice
     (``tests.grafana.counterparts``), in the unit the panel declares.

Tolerance: relative 1e-9 (absolute 1e-12 near zero). The panels read the 1-minute rollups where
the pages (windows under 6 h) read the raw samples, and the hourly and 6-hour rollups as the pages
do for ranges over 7 and 15 days; both are sums of the same stored increases and values
(a rollup bucket holds its samples' sums, ``migrations/clickhouse/0011``), divided and interpolated
the same way, so they differ only in the order floating-point additions happen in (ClickHouse's
parallel aggregation, pandas' sums): a few ulps, under 1e-12 relative where measured. A wrong
column, quantile, unit or window edge moves a number by far more (``test_a_wrong_panel_is_caught``).
The windows are whole minutes: Grafana's range is whatever the user picks, and the panels then
read the minutes it touches (the rollups' buckets), as analytics does on a rollup tier.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any, cast

import numpy as np
import pandas as pd
import pytest

from analytics.filters import Filters
from analytics.tiers import param_time
from storage.clickhouse import Client
from tests.analytics.scenario_data import Run, play
from tests.grafana.counterparts import COUNTERPARTS, Counterpart, View
from tests.grafana.macros import Range, Values, expand, resolve

ROOT = Path(__file__).resolve().parents[2]
DASHBOARDS = sorted((ROOT / "grafana").glob("*.json"))
PLUGIN = "grafana-clickhouse-datasource"
PANEL_FORMATS = {"timeseries": 0, "stat": 1, "table": 1}  # the plugin's format: 0 time series, 1 table
QUERY_TYPES = {0: "timeseries", 1: "table"}
RTOL, ATOL = 1e-9, 1e-12


def load(path: Path) -> dict[str, Any]:
    found: dict[str, Any] = json.loads(path.read_text())
    return found


def client(store: Run) -> Client:
    return cast(Client, store.client)


def load_uid(uid: str) -> dict[str, Any]:
    return next(d for d in map(load, DASHBOARDS) if d["uid"] == uid)


def panels(dashboard: dict[str, Any]) -> list[dict[str, Any]]:
    """Every panel, those inside rows too."""
    out = []
    for panel in dashboard["panels"]:
        out.append(panel)
        out.extend(panel.get("panels", []))
    return [p for p in out if p["type"] != "row"]


# --------------------------------------------------------------------------- the JSON, without a store


def check_dashboard(d: dict[str, Any]) -> None:
    """What Grafana and the plugin need of an imported dashboard (their documented format)."""
    assert isinstance(d["schemaVersion"], int) and d["schemaVersion"] >= 36, "schemaVersion of Grafana 10 or later"
    assert d["uid"] and d["title"] and d["id"] is None
    assert any(i["type"] == "datasource" and i["pluginId"] == PLUGIN for i in d["__inputs"])
    required = {(r["type"], r["id"]) for r in d["__requires"]}
    assert ("datasource", PLUGIN) in required
    assert {("panel", p["type"]) for p in panels(d)} <= required, "every panel type is in __requires"
    variables = {v["name"]: v for v in d["templating"]["list"]}
    assert len(variables) == len(d["templating"]["list"]), "variable names are unique"
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == PLUGIN
    for v in variables.values():
        if v["type"] == "query":
            assert v["datasource"] == {"type": PLUGIN, "uid": "${datasource}"}, v["name"]
            assert v["query"]["editorType"] == "sql" and v["query"]["rawSql"].strip(), v["name"]
    ids = [p["id"] for p in panels(d)]
    assert len(set(ids)) == len(ids), f"panel ids repeat: {sorted(ids)}"
    for p in panels(d):
        check_panel(p)
    check_layout(panels(d))


def check_panel(p: dict[str, Any]) -> None:
    name = f"panel {p['id']} ({p.get('title')})"
    assert p.get("title") and p.get("description"), f"{name}: a title and a description"
    assert p["datasource"] == {"type": PLUGIN, "uid": "${datasource}"}, name
    assert p["type"] in PANEL_FORMATS, f"{name}: a panel type these tests know"
    assert p["targets"], f"{name}: a query"
    refs = [t["refId"] for t in p["targets"]]
    assert len(set(refs)) == len(refs), f"{name}: refIds repeat"
    for t in p["targets"]:
        assert t["datasource"]["type"] == PLUGIN, name
        assert t["editorType"] == "sql" and isinstance(t["rawSql"], str) and t["rawSql"].strip(), name
        assert t["format"] == PANEL_FORMATS[p["type"]], f"{name}: format {t['format']} for a {p['type']} panel"
        assert t["queryType"] == QUERY_TYPES[t["format"]], name
    assert p["fieldConfig"]["defaults"].get("unit") or p["type"] == "table", f"{name}: a unit"


def check_layout(found: list[dict[str, Any]]) -> None:
    """Panels inside the 24 columns, none over another."""
    cells: dict[tuple[int, int], int] = {}
    for p in found:
        g = p["gridPos"]
        assert g["x"] >= 0 and g["w"] > 0 and g["x"] + g["w"] <= 24 and g["h"] > 0, p["id"]
        for x in range(g["x"], g["x"] + g["w"]):
            for y in range(g["y"], g["y"] + g["h"]):
                assert (x, y) not in cells, f"panels {cells.get((x, y))} and {p['id']} overlap"
                cells[(x, y)] = p["id"]


def test_two_dashboards_are_shipped() -> None:
    uids = [load(p)["uid"] for p in DASHBOARDS]
    assert sorted(uids) == ["fleetscope-cost", "fleetscope-overview"]


@pytest.mark.parametrize("path", DASHBOARDS, ids=lambda p: p.stem)
def test_dashboard_is_well_formed(path: Path) -> None:
    check_dashboard(load(path))


def test_every_panel_has_its_counterpart() -> None:
    """A panel added without saying which Streamlit number it shows fails here."""
    shipped = {(load(p)["uid"], panel["id"]) for p in DASHBOARDS for panel in panels(load(p))}
    assert shipped == set(COUNTERPARTS)


def test_a_broken_dashboard_is_refused() -> None:
    d = load(DASHBOARDS[0])
    broken = json.loads(json.dumps(d))
    broken["panels"][1]["id"] = broken["panels"][0]["id"]
    with pytest.raises(AssertionError, match="panel ids repeat"):
        check_dashboard(broken)
    broken = json.loads(json.dumps(d))
    broken["panels"][0]["targets"][0]["datasource"] = {"type": "prometheus", "uid": "x"}
    with pytest.raises(AssertionError):
        check_dashboard(broken)


# --------------------------------------------------------------------------- on a store


@dataclass(frozen=True)
class Case:
    """A store, a window (whole minutes), a panel interval and a model choice; the rollup the range
    must pick, and what of the rules the case is there to reach (checked on the panels' answers:
    ``REACHES``)."""

    scenario: str
    seed: int
    begin_m: int  # minutes after the scenario's start (before it: negative)
    end_m: int  # minutes before its end
    interval_s: int
    model: tuple[str, ...] | None  # the model variable's choice (None: All)
    reaches: tuple[str, ...] = ()
    tier: str = "1m"  # the engine metrics' rollup for the range (the cost rule reads 6 h as 1 h)

    @property
    def id(self) -> str:
        return f"{self.scenario}-{'all' if self.model is None else '+'.join(self.model)}-{self.interval_s}s-{self.tier}"

    def step(self, table: str) -> int:
        """Seconds per step of a time-series panel on ``table`` (samples, requests): the interval
        rounded up to whole buckets of the rollup the range picks."""
        bucket = {"1m": 60, "1h": 3600, "6h": 21600}[self.tier]
        if table == "requests":
            bucket = min(bucket, 3600)
        return bucket * math.ceil(self.interval_s / bucket)


CASES = [
    # small-1 holds its requests and generates nothing from +3 to +9 min, then goes on; the window
    # leaves data on both sides of it: a bucket too many or too few at an edge shows
    Case("engine-stall", 1, 2, 1, 60, None, ("several models and tenants", "idle spend")),
    Case("engine-stall", 1, 1, 0, 120, ("tiny-small",), ("one model",)),
    # small-1 killed at +2 min, back at +5 (time down, counters restart); the request log of
    # tiny-large lost for three minutes (LOST): spend no logged request accounts for
    Case("replica-crash", 2, 0, 0, 45, None, ("a replica down", "unattributed spend")),
    # ranges past 7 and 15 days: the hourly and 6-hour rollups (the cost rule in hours)
    Case("replica-crash", 2, -8 * 1440, 0, 7200, None, (), "1h"),
    Case("replica-crash", 2, -16 * 1440, 0, 14400, ("tiny-large",), (), "6h"),
    # four LoRA adapters on small-0 (fleet-spec-lora.yaml): their requests pay in tiny-small's pool
    Case("adapter-thrash", 1, 2, 2, 60, ("tiny-small",), ("adapters in their base model's pool",)),
]
SPECS = {"adapter-thrash": "fleet-spec-lora.yaml"}  # the fleet a scenario plays on (else fleet.yaml)
LOST = {"replica-crash": ("tiny-large", 6, 9)}  # the request log's rows of a model, minutes after the start

COST_BY_REPLICA, SHOWBACK = ("fleetscope-cost", 4), ("fleetscope-cost", 3)
Answers = dict[tuple[str, int], pd.DataFrame]
REACHES: dict[str, Callable[[Answers], bool]] = {
    "several models and tenants": lambda got: (
        got[SHOWBACK]["tenant"].nunique() >= 3 and got[("fleetscope-overview", 6)]["model"].nunique() == 2
    ),
    "one model": lambda got: set(got[COST_BY_REPLICA]["model"]) == {"tiny-small"},
    "idle spend": lambda got: got[COST_BY_REPLICA]["idle_spend"].sum() > 0,
    "a replica down": lambda got: (
        got[COST_BY_REPLICA]["gpu_hours"].min() < 0.9 * got[COST_BY_REPLICA]["gpu_hours"].median()
    ),
    "unattributed spend": lambda got: "(unattributed)" in set(got[SHOWBACK]["tenant"]),
    "adapters in their base model's pool": lambda got: (
        got[("fleetscope-overview", 10)]["model"].nunique() == 1  # the Traffic page: tiny-small's own requests
        and got[SHOWBACK]["requests"].sum() > got[("fleetscope-overview", 10)]["requests_per_s"].sum() * 60
    ),
}


def lose_request_log(store: Run, model: str, begin_m: int, end_m: int) -> None:
    """The request log's rows of ``model`` gone for a stretch (a gateway that could not send its
    log, a sampled log): the raw rows and their rollup both."""
    a, b = store.start + timedelta(minutes=begin_m), store.start + timedelta(minutes=end_m)
    for table in ("requests", "requests_1m"):
        client(store).command(
            f"ALTER TABLE {table} DELETE WHERE model = {{m:String}} AND ts >= {{a:DateTime64(3)}} "
            "AND ts < {b:DateTime64(3)} SETTINGS mutations_sync = 2",
            parameters={"m": model, "a": param_time(a), "b": param_time(b)},
        )


@pytest.fixture(scope="module")
def stores(chdb_dir: Path) -> dict[str, Run]:
    played = sorted({(c.scenario, c.seed) for c in CASES})
    out = {s: play(chdb_dir, s, seed=n, spec=SPECS.get(s, "fleet.yaml")) for s, n in played}
    for scenario, lost in LOST.items():
        lose_request_log(out[scenario], *lost)
    return out


@dataclass
class Expanded:
    dashboard: str  # uid
    panel: dict[str, Any]
    sql: str
    view: View


def expanded(store: Run, case: Case, edit: Callable[[str], str] = str) -> list[Expanded]:
    """Every panel of every dashboard, expanded for the case's range, interval and model choice
    (its SQL first changed by ``edit``)."""
    start = store.start + timedelta(minutes=case.begin_m)
    end = store.end - timedelta(minutes=case.end_m)
    rng = Range(start, end, case.interval_s)
    picked: Values = {} if case.model is None else {"model": case.model}
    view = View(
        start, end, case.step("samples"), case.step("requests"), Filters(model=list(case.model)) if case.model else None
    )
    out = []
    for path in DASHBOARDS:
        d = load(path)
        values = resolve(d, rng, lambda sql: client(store).query(sql).result_rows, picked)
        tables = {
            "samples": f"samples_{case.tier}",
            "cost_samples": "samples_1m" if case.tier == "1m" else "samples_1h",
        }
        assert {k: values[k] for k in tables if k in values} == {k: v for k, v in tables.items() if k in values}
        for p in panels(d):
            out.append(Expanded(d["uid"], p, expand(edit(p["targets"][0]["rawSql"]), rng, values), view))
    return out


def normalized(df: pd.DataFrame, cp: Counterpart) -> pd.DataFrame:
    out = df[[*cp.keys, *cp.units]].copy()
    for key in cp.keys:
        if key == "time":
            out[key] = pd.to_datetime(out[key], utc=True).astype("datetime64[ns, UTC]")
        else:
            out[key] = out[key].astype(str)
    for column in cp.units:
        out[column] = pd.to_numeric(out[column], errors="coerce").astype(float)
    return out.reset_index(drop=True)


def unit_of(panel: dict[str, Any], column: str) -> str | None:
    """The Grafana unit ``column`` is shown in: its override's, else the panel's default."""
    for o in panel["fieldConfig"]["overrides"]:
        if o["matcher"] == {"id": "byName", "options": column}:
            for prop in o["properties"]:
                if prop["id"] == "unit":
                    return str(prop["value"])
    unit = panel["fieldConfig"]["defaults"].get("unit")
    return str(unit) if unit else None


def compare(e: Expanded, got: pd.DataFrame, expected: pd.DataFrame) -> None:
    """The panel's rows and numbers against its counterpart's: the same rows, each number within
    the tolerance (NaN, no number, only against NaN), shown in the unit analytics' number is in."""
    cp = COUNTERPARTS[(e.dashboard, e.panel["id"])]
    name = f"{e.dashboard} panel {e.panel['id']} ({e.panel['title']}) vs {cp.page or cp.call}"
    for column, unit in cp.units.items():
        assert unit_of(e.panel, column) == unit, f"{name}: {column} shown in {unit_of(e.panel, column)}, not {unit}"
    ours, theirs = normalized(got, cp), normalized(expected, cp)
    assert len(theirs), f"{name}: analytics has no rows to compare with"
    keys = list(cp.keys)
    if keys:
        both = ours.merge(theirs, on=keys, how="outer", suffixes=("", "_analytics"), indicator=True)
        alone = both[both["_merge"] != "both"]
        assert alone.empty, f"{name}: rows on one side only:\n{alone[[*keys, '_merge']].head(10)}"
    else:
        assert len(ours) == len(theirs) == 1, name
        both = pd.concat([ours, theirs.add_suffix("_analytics")], axis=1)
    for column in cp.units:
        a, b = both[column].to_numpy(float), both[f"{column}_analytics"].to_numpy(float)
        close = np.isclose(a, b, rtol=RTOL, atol=ATOL, equal_nan=True)
        assert close.all(), f"{name}: {column} differs:\n{both.loc[~close, [*keys, column, f'{column}_analytics']]}"


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_every_panel_shows_the_streamlit_number(stores: dict[str, Run], case: Case) -> None:
    store = stores[case.scenario]
    answers: Answers = {}
    for e in expanded(store, case):
        got = client(store).query_df(e.sql)
        assert len(got), f"{e.dashboard} panel {e.panel['id']} ({e.panel['title']}): no rows"
        if e.panel["type"] == "timeseries":  # the plugin's time series: a time column first
            assert got.columns[0] == "time" and pd.api.types.is_datetime64_any_dtype(got["time"]), e.panel["title"]
        compare(e, got, COUNTERPARTS[(e.dashboard, e.panel["id"])].read(store.client, e.view))
        answers[(e.dashboard, e.panel["id"])] = got
    for what in case.reaches:
        assert REACHES[what](answers), f"{case.id} does not reach {what}: the case no longer tests it"


# a panel written wrong in the ways a dashboard goes wrong: the comparison must say so
MUTATIONS = [
    pytest.param(0, "fleetscope-overview", 3, "0.99 * total", "0.95 * total", id="another quantile"),
    pytest.param(0, "fleetscope-overview", 8, "avg(v.mean) AS kv_used", "avg(v.mean) * 100 AS kv_used", id="percent"),
    pytest.param(0, "fleetscope-overview", 1, "ts < $__toTime", "ts <= $__toTime", id="timeFilter's inclusive end"),
    pytest.param(0, "fleetscope-overview", 10, "sum(requests) / step", "sum(requests)", id="per step, not per second"),
    pytest.param(0, "fleetscope-overview", 9, "max(value_max) AS hi", "max(value_min) AS hi", id="wrong column"),
    pytest.param(0, "fleetscope-cost", 3, "* w_output", "* w_input", id="output tokens weighed as input"),
    pytest.param(2, "fleetscope-cost", 4, "2.5 * typical", "250 * typical", id="a crash counted as time up"),
    pytest.param(
        5, "fleetscope-cost", 3, "if(a.base != '', a.base, r.model) AS pool", "r.model AS pool", id="adapters"
    ),
    pytest.param(
        0, "fleetscope-cost", 2, '"id": "unit", "value": "currencyUSD"', '"id": "unit", "value": "short"', id="unit"
    ),
]


@pytest.mark.parametrize("case_at,uid,panel_id,old,new", MUTATIONS)
def test_a_wrong_panel_is_caught(
    stores: dict[str, Run], case_at: int, uid: str, panel_id: int, old: str, new: str
) -> None:
    case = CASES[case_at]
    store = stores[case.scenario]
    in_sql = old in next(p for p in panels(load_uid(uid)) if p["id"] == panel_id)["targets"][0]["rawSql"]
    edit: Callable[[str], str] = (lambda sql: sql.replace(old, new)) if in_sql else str
    e = next(x for x in expanded(store, case, edit) if (x.dashboard, x.panel["id"]) == (uid, panel_id))
    if not in_sql:  # the panel's settings
        assert old in json.dumps(e.panel), f"{old!r} is in neither the panel's SQL nor its settings"
        e.panel = json.loads(json.dumps(e.panel).replace(old, new, 1))
    got = client(store).query_df(e.sql)
    with pytest.raises(AssertionError, match="differs|one side only|shown in"):
        compare(e, got, COUNTERPARTS[(uid, panel_id)].read(store.client, e.view))
