"""The Streamlit app: ``streamlit run dashboard/app.py`` (``fleetscope dashboard`` does it with the
configured stores). Pages live in ``dashboard/screens`` (not ``pages``: Streamlit would serve those files
bare, past the login); each renders what ``analytics`` returns.

In:  the settings (``FLEETSCOPE_CONFIG``), the URL query string (the view: time range, refresh,
     filters).
Out: the multipage app, refreshing itself at the chosen interval.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import streamlit as st

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # `streamlit run dashboard/app.py` from a checkout
    sys.path.insert(0, str(ROOT))

from dashboard.auth import authenticated, require_login  # noqa: E402
from dashboard.context import settings_for_login  # noqa: E402
from dashboard.view import read_view  # noqa: E402

PAGES = Path(__file__).resolve().parent / "screens"  # not "pages": Streamlit would serve those files bare, past the login

st.set_page_config(page_title="fleetscope", layout="wide")
settings = settings_for_login()
allowed = authenticated(settings)
PAGE_LIST = [  # (file, title, url path, icon)
    ("overview.py", "Overview", "overview", ":material/monitor_heart:"),
    ("latency.py", "Latency", "latency", ":material/timer:"),
    ("capacity.py", "Cache & capacity", "capacity", ":material/memory:"),
    ("traffic.py", "Traffic & drift", "traffic", ":material/swap_calls:"),
    ("cost.py", "Cost", "cost", ":material/payments:"),
    ("investigate.py", "Investigate", "investigate", ":material/troubleshoot:"),
    ("fleet.py", "Fleet", "fleet", ":material/dns:"),
]
# the page is picked from the URL before the login, so that the visitor lands on it after
page = st.navigation([st.Page(str(PAGES / file), title=title, url_path=path, icon=icon, default=i == 0)
                      for i, (file, title, path, icon) in enumerate(PAGE_LIST)], position="sidebar" if allowed else "hidden")
require_login(settings)
page.run()
refresh = read_view(dict(st.query_params)).refresh_s
if refresh:  # a countdown that a click interrupts (every st call checks for a rerun request), then rerun
    note = st.sidebar.empty()
    for left in range(refresh, 0, -1):
        note.caption(f"refreshing in {left}s")
        time.sleep(1)
    st.rerun()
