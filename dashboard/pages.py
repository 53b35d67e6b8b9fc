"""The dashboard's pages, listed once: ``dashboard/app.py`` builds its navigation from ``PAGES``, and
the page tests, the browser test and the dashboard benchmark visit every page in it.

In:  nothing (the list is data).
Out: ``PAGES``, one ``Page`` per page in the sidebar's order (the first is the default page, served at
     ``/``); ``SCREENS``, the directory of the page files (not ``pages``: Streamlit would serve those
     files bare, past the login).
"""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

__all__ = ["PAGES", "SCREENS", "Page"]

SCREENS = Path(__file__).resolve().parent / "screens"


class Page(NamedTuple):
    file: str  # in SCREENS
    title: str  # the sidebar's entry and the page's own title
    url_path: str
    icon: str
    # False for a page that draws no chart until its form is sent (the Plan page replays only when asked)
    draws_on_open: bool = True

    @property
    def path(self) -> Path:
        return SCREENS / self.file


PAGES: tuple[Page, ...] = (
    Page("overview.py", "Overview", "overview", ":material/monitor_heart:"),
    Page("latency.py", "Latency", "latency", ":material/timer:"),
    Page("capacity.py", "Cache & capacity", "capacity", ":material/memory:"),
    Page("traffic.py", "Traffic & drift", "traffic", ":material/swap_calls:"),
    Page("cost.py", "Cost", "cost", ":material/payments:"),
    Page("quality.py", "Quality", "quality", ":material/fact_check:"),
    Page("investigate.py", "Investigate", "investigate", ":material/troubleshoot:"),
    Page("plan.py", "Plan", "plan", ":material/science:", draws_on_open=False),
    Page("alerts.py", "Alerts", "alerts", ":material/notifications:"),
    Page("sql.py", "SQL", "sql", ":material/terminal:"),
    Page("fleet.py", "Fleet", "fleet", ":material/dns:"),
)
