"""Cached analytics calls for pages: the same call with the same arguments reads ClickHouse once
(a page with ten panels, a refresh, two users on one view).

In:  an ``analytics`` function, the client, and its arguments (hashable: datetimes, ``Filters``,
     strings, numbers, tuples; dicts are turned into sorted tuples).
Out: its result, from ``st.cache_data``. The arguments carry the window, whose end
     ``dashboard.view`` rounds to the range's grain (10 s for an hour, 10 min for 30 days): a
     rerun or refresh within the grain reads the cache, the next grain queries again. ``TTL_S``
     only bounds how long an answer nobody asks for again is kept.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import streamlit as st

__all__ = ["TTL_S", "cached"]

TTL_S = 600  # the largest grain (dashboard.view.grain)


def _key(value: Any) -> Any:
    if isinstance(value, dict):
        return tuple(sorted((k, _key(v)) for k, v in value.items()))
    if isinstance(value, list):
        return tuple(_key(v) for v in value)
    return value


@st.cache_data(ttl=TTL_S, show_spinner=False, max_entries=512)
def _run(_fn: Callable[..., Any], _client: Any, _args: tuple, _kwargs: dict, key: str) -> tuple[bool, Any]:
    try:
        return True, _fn(_client, *_args, **_kwargs)
    except (ValueError, KeyError) as exc:  # an answer too ("no rows to compare", "no price for L40S"): kept
        return False, exc


def cached(fn: Callable[..., Any], client: Any, *args: Any, **kwargs: Any) -> Any:
    """``fn(client, *args, **kwargs)``, cached; the ``ValueError``/``KeyError`` it raises for a view
    is cached and raised again, so a page that explains why it cannot show something stays fast."""
    key = repr((fn.__module__, fn.__qualname__, id(client), _key(list(args)), _key(kwargs)))
    ok, value = _run(fn, client, args, kwargs, key)
    if not ok:
        raise value
    return value
