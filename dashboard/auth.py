"""Who may see the dashboard: nobody is asked on a loopback address (``fleetscope dashboard``
refuses any other address unless one of these is configured); with ``dashboard.password`` a
browser session asks for it once; with ``dashboard.oidc`` Streamlit's OIDC login
(``st.login``, the provider configured in ``.streamlit/secrets.toml``) is required, and the
account's email must be in ``dashboard.allowed_emails`` (an address or ``@domain``).

In:  the ``dashboard`` settings section.
Out: ``authenticated(settings)``: may this session see the pages; ``require_login(settings)``
     returns when it may, and otherwise draws the login form and stops the script run.
"""

from __future__ import annotations

import hmac
import time
from typing import Any

import streamlit as st

__all__ = ["authenticated", "require_login"]

_KEY = "fleetscope_authenticated"


def authenticated(settings: Any) -> bool:
    """May this browser session see the pages (nothing is drawn)?"""
    dash = getattr(settings, "dashboard", None)
    if dash is None or not dash.protected:
        return True
    if dash.oidc:
        return bool(st.user.is_logged_in) and dash.allows(st.user.get("email"))
    return bool(st.session_state.get(_KEY))


def require_login(settings: Any) -> None:
    """Return when the visitor may see the pages; else draw the login and stop the run (the
    page asked for stays in the URL, so the visitor lands on it after logging in)."""
    if authenticated(settings):
        return
    dash = settings.dashboard
    st.title("fleetscope")
    if dash.oidc:
        if st.user.is_logged_in:  # a valid account, not on the allow-list
            st.error(f"{st.user.get('email') or 'This account'} may not see this dashboard (dashboard.allowed_emails).")
            st.button("Log out", on_click=st.logout)
        else:
            st.button("Log in", on_click=st.login, type="primary")
        st.stop()
    with st.form("login"):
        given = st.text_input("Password", type="password")
        sent = st.form_submit_button("Log in", type="primary")
    if sent:
        if hmac.compare_digest(given.encode(), dash.password.get_secret_value().encode()):
            st.session_state[_KEY] = True
            st.rerun()
        time.sleep(1.0)  # slows guessing down
        st.error("Wrong password.")
    st.stop()
