"""What every page starts with: the stores, and the global controls in the sidebar, kept in the
URL query string.

In:  stores handed in with ``use_stores`` (tests, ``fleetscope up``), or else a provider that
     loads the settings and opens the stores, registered with ``provide`` by whoever starts the
     server (``fleetscope dashboard``, through ``fleetscope.dashboard_main``; the stores are
     opened once per server process with ``st.cache_resource``); the query string. The
     dashboard knows the settings by their sections' attributes only: it does not load them.
Out: ``page_context()`` -> ``Context(view, client, sessions, settings, marks)`` after drawing the
     sidebar (time range, refresh, filters) and writing the choice back to the query string;
     a store that cannot be opened stops the page with one clear error instead of a traceback;
     ``marks`` are the window's annotations and the autoscaler's decisions
     (``analytics.elasticity.scale_marks``: "tiny-large 1 -> 2 (kv_cache_usage 0.86 > 0.8)",
     tagged ``kind: scale``), which ``dashboard.marks`` draws on every time chart.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import streamlit as st

from dashboard.view import FILTER_KEYS, MAX_GRAIN_S, RANGES, REFRESH, View, read_view, view_params

__all__ = [
    "Context",
    "Provider",
    "current_params",
    "page_context",
    "plain",
    "provide",
    "settings_for_login",
    "shown",
    "use_stores",
]

_INJECTED: dict[str, Any] = {}
VIEW_KEYS = {"range", "from", "to", "refresh", *FILTER_KEYS}
_LAST_VIEW = "fleetscope_view"


@dataclass(frozen=True)
class Provider:
    """How the pages get their configuration when no stores were handed in: ``settings()`` reads
    it (``ValueError`` with one line when it is bad), ``stores(settings)`` opens (client,
    metadata sessions), ``reader(settings)``, when given, one more ClickHouse client on the same
    store (``dashboard.cache.fetch`` reads a page's independent answers at once on a few)."""

    settings: Callable[[], Any]
    stores: Callable[[Any], tuple[Any, Any]]
    reader: Callable[[Any], Any] | None = None


_PROVIDER: list[Provider] = []
_NO_PROVIDER = (
    "This dashboard was started without its configuration: run it with `fleetscope dashboard` "
    "(or `fleetscope up`), which reads fleetscope.yaml and opens the stores."
)


@dataclass
class Context:
    view: View
    client: Any
    sessions: Any
    settings: Any
    marks: list[Any] = field(default_factory=list)
    readers: list[Any] = field(default_factory=list)  # more clients on the store, for dashboard.cache.fetch

    def fetch(self, **calls: Any) -> Any:
        """``dashboard.cache.fetch`` of ``calls`` (name -> ``dashboard.cache.call(...)``) on this
        page's client and readers."""
        from dashboard.cache import fetch

        return fetch(self.client, calls, self.readers)


def shown(value: Any, pattern: str, scale: float = 1.0) -> str:
    """``pattern`` (e.g. ``"{:.3f} s"``) of ``value * scale``, or "–" when there is no number."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        return "–"
    return "–" if math.isnan(number) else pattern.format(number * scale)


def plain(df: Any) -> Any:
    """``df`` without ``.attrs`` (query plans are for code, not for the table widget)."""
    out = df.copy()
    out.attrs = {}
    return out


def use_stores(client: Any, sessions: Any = None, settings: Any = None, readers: list[Any] | None = None) -> None:
    """Serve pages from these stores instead of opening the configured ones (``readers``: more
    clients on the same store, for reading a page's answers at once)."""
    _INJECTED.update(client=client, sessions=sessions, settings=settings, readers=list(readers or []))


def provide(provider: Provider) -> None:
    """Register how the pages load the settings and open the stores (once, before the server runs)."""
    _PROVIDER[:] = [provider]


def _provider() -> Provider:
    if not _PROVIDER:
        st.error(_NO_PROVIDER)
        st.stop()
    return _PROVIDER[0]


@st.cache_resource(show_spinner=False)
def _configured() -> tuple[Any, Any, Any, list[Any]]:
    provider = _provider()
    settings = provider.settings()
    client, sessions = provider.stores(settings)
    from dashboard.cache import (
        READERS,  # here: its st.cache_data wants the server's runtime (fleetscope up imports this module)
    )

    wanted = settings.dashboard.reader_count() if hasattr(settings, "dashboard") else READERS
    readers = [provider.reader(settings) for _ in range(wanted)] if provider.reader and wanted > 1 else []
    return client, sessions, settings, readers


def settings_for_login() -> Any:
    """The settings the login gate reads: the injected ones, or the configured file (read
    without opening any store, so an unreachable ClickHouse cannot skip the gate)."""
    if _INJECTED:
        return _INJECTED["settings"]
    provider = _provider()
    try:
        return provider.settings()
    except ValueError as exc:  # no page without the login it may configure; details in the server's log only
        print(f"fleetscope dashboard: configuration error: {exc}", file=sys.stderr, flush=True)
        st.error(
            "The fleetscope configuration cannot be read: see the dashboard server's log (`fleetscope config check`)."
        )
        st.stop()


def _stores() -> tuple[Any, Any, Any, list[Any]]:
    if _INJECTED:
        return _INJECTED["client"], _INJECTED["sessions"], _INJECTED["settings"], _INJECTED.get("readers", [])
    return _configured()


def _sidebar(view: View, choices: dict[str, list[str]]) -> dict[str, str]:
    """Draw the controls; return the query string they ask for."""
    side = st.sidebar
    keys = [*RANGES, "custom"]
    range_key = side.selectbox(
        "Time range",
        keys,
        index=keys.index(view.range_key),
        key="range",
        help="Last 15 minutes to 30 days, or a custom window (UTC).",
    )
    params: dict[str, str] = {}
    if range_key == "custom":
        start = side.text_input("From (UTC, ISO 8601)", view.start.isoformat(), key="from")
        end = side.text_input("To (UTC, ISO 8601)", view.end.isoformat(), key="to")
        params.update({"from": start, "to": end})
    else:
        params["range"] = range_key
    refresh = side.selectbox(
        "Auto-refresh",
        REFRESH,
        index=REFRESH.index(view.refresh_s) if view.refresh_s in REFRESH else 2,
        format_func=lambda s: "off" if s == 0 else f"every {s}s",
        key="refresh",
    )
    params["refresh"] = str(refresh)
    # the filter boxes open from one button: four of them drawn on every page took the browser a
    # seventh of a second each first render (bench/bench_dashboard.py's notes); the button says
    # how many are on, and the page's caption which
    active = sum(bool(st.session_state.get(f"f_{key}", getattr(view.filters, key))) for key in choices)
    box = side.popover(f"Filters ({active})" if active else "Filters", width="stretch", key="filters")
    for key, options in choices.items():
        chosen = getattr(view.filters, key)
        picked = box.multiselect(
            key.capitalize(), sorted(set(options) | set(chosen)), default=list(chosen), key=f"f_{key}"
        )
        if picked:
            params[key] = ",".join(picked)
    return params


def current_params() -> dict[str, str]:
    """The query string, with this session's last view where it has none: switching pages in the
    sidebar drops the query string, and the time range and filters should stay."""
    params = dict(st.query_params)
    last = st.session_state.get(_LAST_VIEW)
    if last and not VIEW_KEYS & params.keys():
        params.update(last)
        st.query_params.update(last)
    return params


def page_context(title: str) -> Context:
    """The page's stores and view, after drawing the sidebar controls."""
    from clickhouse_connect.driver.exceptions import DatabaseError

    from analytics.dimensions import dimension_values
    from dashboard.cache import cached
    from storage.errors import StoreError

    params = current_params()
    try:
        client, sessions, settings, readers = _stores()
        longest = int(getattr(getattr(settings, "dashboard", None), "max_grain_s", MAX_GRAIN_S))
        view = read_view(params, longest_grain=longest)
        choices = cached(dimension_values, client, view.start, view.end)
    except StoreError as exc:
        st.error(f"The store cannot be read: {exc}")
        st.stop()
    except DatabaseError as exc:
        first = str(exc).strip().splitlines()[0][:300]
        hint = " (run `fleetscope migrate`)" if "Unknown table" in first else ""
        st.error(f"The store cannot be read{hint}: {first}")
        st.stop()
    for problem in view.problems:
        st.warning(problem)
    wanted = _sidebar(view, choices)
    if wanted != view_params(view):  # keep the page's own keys (e.g. Investigate's metric)
        own = {k: v for k, v in st.query_params.items() if k not in VIEW_KEYS}
        st.query_params.from_dict({**own, **wanted})
        view = read_view(wanted, longest_grain=longest)
    st.session_state[_LAST_VIEW] = wanted
    st.title(title)
    st.caption(
        f"{view.start:%Y-%m-%d %H:%M} – {view.end:%Y-%m-%d %H:%M} UTC"
        + (f" · refresh every {view.refresh_s}s" if view.refresh_s else "")
        + "".join(
            f" · {key} {', '.join(getattr(view.filters, key))}" for key in FILTER_KEYS if getattr(view.filters, key)
        )
    )
    return Context(view, client, sessions, settings, _marks(sessions, view) + _scale_marks(client, view), readers)


def _marks(sessions: Any, view: View) -> list[Any]:
    from sqlalchemy.exc import SQLAlchemyError

    from storage.catalog import annotations_in

    if sessions is None:
        return []
    try:
        return annotations_in(sessions, view.start, view.end)
    except SQLAlchemyError as exc:  # the charts still draw; say why the markers are missing
        st.caption(
            f"Annotations unavailable (metadata DB: {str(exc).splitlines()[0][:200]}; run `fleetscope migrate`)."
        )
        return []


def _scale_marks(client: Any, view: View) -> list[Any]:
    """The autoscaler's decisions in the window as marks (id -1: not annotations one can edit)."""
    from clickhouse_connect.driver.exceptions import DatabaseError

    from analytics.elasticity import scale_marks
    from dashboard.cache import cached
    from storage.catalog import Mark

    try:
        found = cached(scale_marks, client, view.start, view.end)
    except DatabaseError as exc:  # a store migrated before scale_events: the charts draw without them
        st.caption(f"Scale events unavailable ({str(exc).strip().splitlines()[0][:200]}; run `fleetscope migrate`).")
        return []
    return [Mark(-1, ts, title, text=text, tags={"kind": "scale"}) for ts, title, text in found]
