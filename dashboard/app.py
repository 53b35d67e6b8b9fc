"""The Streamlit app: ``streamlit run dashboard/app.py`` (``fleetscope dashboard`` does it with the
configured stores). The pages, listed in ``dashboard.pages``, live in ``dashboard/screens``; each
renders what ``analytics`` returns.

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
from dashboard.context import current_params, settings_for_login  # noqa: E402
from dashboard.pages import PAGES  # noqa: E402
from dashboard.view import read_view  # noqa: E402

# an icon of its own for the browser tab: a page's material icon would be fetched from fonts.gstatic.com,
# which a dashboard on a closed network cannot reach (the console said so on every page)
st.set_page_config(
    page_title="fleetscope", page_icon=str(Path(__file__).resolve().parent / "favicon.svg"), layout="wide"
)
settings = settings_for_login()
allowed = authenticated(settings)
# the page is picked from the URL before the login, so that the visitor lands on it after
page = st.navigation(
    [
        st.Page(str(p.path), title=p.title, url_path=p.url_path, icon=p.icon, default=i == 0)
        for i, p in enumerate(PAGES)
    ],
    position="sidebar" if allowed else "hidden",
)
require_login(settings)
refresh = read_view(current_params()).refresh_s
if refresh:  # before the page runs: a page with nothing to show stops its run early, and should refresh too
    st.session_state["fleetscope_full_run_at"] = time.monotonic()

    @st.fragment(run_every=refresh)
    def _refresh() -> None:
        # called in the full run (no rerun then) and by the timer every `refresh` seconds (rerun the app)
        if time.monotonic() - st.session_state.get("fleetscope_full_run_at", 0.0) >= 0.8 * refresh:
            st.rerun(scope="app")

    _refresh()
page.run()
