"""Cached analytics calls for pages: the same call with the same arguments within a few seconds
reads ClickHouse once (a page with ten panels, a refresh, two users on one view).

In:  an ``analytics`` function, the client, and its arguments (hashable: datetimes, ``Filters``,
     strings, numbers, tuples; dicts are turned into sorted tuples).
Out: its result, from ``st.cache_data`` (``TTL_S``); the window's end is rounded by
     ``dashboard.view`` so that reruns within the refresh interval hit the cache.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import streamlit as st

__all__ = ["TTL_S", "cached"]

TTL_S = 10


def _key(value: Any) -> Any:
    if isinstance(value, dict):
        return tuple(sorted((k, _key(v)) for k, v in value.items()))
    if isinstance(value, list):
        return tuple(_key(v) for v in value)
    return value


@st.cache_data(ttl=TTL_S, show_spinner=False, max_entries=512)
def _run(_fn: Callable[..., Any], _client: Any, _args: tuple, _kwargs: dict, key: str) -> Any:
    return _fn(_client, *_args, **_kwargs)


def cached(fn: Callable[..., Any], client: Any, *args: Any, **kwargs: Any) -> Any:
    key = repr((fn.__module__, fn.__qualname__, id(client), _key(list(args)), _key(kwargs)))
    return _run(fn, client, args, kwargs, key)
