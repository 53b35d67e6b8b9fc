"""Cached analytics calls for pages: the same call with the same arguments reads ClickHouse once
(a page with ten panels, a refresh, two users on one view), and a page's independent calls read
at once.

In:  an ``analytics`` function, the client, and its arguments (hashable: datetimes, ``Filters``,
     strings, numbers, tuples; dicts are turned into sorted tuples); for ``fetch``, several such
     calls by name and the reader handles (more ClickHouse clients on the same store).
Out: its result, from ``st.cache_data``. The arguments carry the window, whose end
     ``dashboard.view`` rounds to the range's grain (10 s for an hour, 10 min for 30 days): a
     rerun or refresh within the grain reads the cache, the next grain queries again. ``TTL_S``
     only bounds how long an answer nobody asks for again is kept. ``fetch`` returns the answers
     by name, each computed on a reader of its own (chDB runs queries on several handles in
     parallel, one at a time on each), keyed as ``cached`` keys them: a page's later ``cached``
     call of the same thing reads the answer, or waits for the one being computed. An exception is
     never an answer: it is not cached, and the next run computes again.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, NamedTuple

import streamlit as st
from streamlit.runtime.scriptrunner import add_script_run_ctx, get_script_run_ctx

__all__ = ["READERS", "TTL_S", "Call", "Fetched", "cached", "call", "fetch"]

TTL_S = 600  # the largest grain (dashboard.view.grain)
READERS = 3  # calls of one page read at once: the 2-core machine gains up to 3, beyond it the CPU is the limit
_POOL = ThreadPoolExecutor(max_workers=8, thread_name_prefix="fleetscope-read")


def _key(value: Any) -> Any:
    if isinstance(value, dict):
        return tuple(sorted((k, _key(v)) for k, v in value.items()))
    if isinstance(value, list):
        return tuple(_key(v) for v in value)
    return value


@st.cache_data(ttl=TTL_S, show_spinner=False, max_entries=512)
def _run(_fn: Callable[..., Any], _client: Any, _args: tuple[Any, ...], _kwargs: dict[str, Any], key: str) -> Any:
    return _fn(_client, *_args, **_kwargs)  # what it raises goes through, not kept: st.cache_data keeps returns only


def _cached_on(fn: Callable[..., Any], client: Any, handle: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """``fn`` run on ``handle``, cached under the key ``client`` gives it (the page's own client)."""
    key = repr((fn.__module__, fn.__qualname__, id(client), _key(list(args)), _key(kwargs)))
    return _run(fn, handle, args, kwargs, key)


def cached(fn: Callable[..., Any], client: Any, *args: Any, **kwargs: Any) -> Any:
    """``fn(client, *args, **kwargs)``, cached; what it raises (a ``ValueError`` a page explains, a store
    that cannot be read) is raised and not cached: the next rerun calls ``fn`` again."""
    return _cached_on(fn, client, client, args, kwargs)


class Call(NamedTuple):
    fn: Callable[..., Any]
    args: tuple[Any, ...]
    kwargs: dict[str, Any]


def call(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Call:
    """``fn(client, *args, **kwargs)``, for ``fetch``."""
    return Call(fn, args, kwargs)


class Fetched(Mapping[str, Any]):
    """``fetch``'s answers by name; reading one whose call raised a ``ValueError``/``KeyError`` raises it
    (this once: it was not cached)."""

    def __init__(self, answers: dict[str, tuple[bool, Any]]) -> None:
        self._answers = answers

    def __getitem__(self, name: str) -> Any:
        ok, value = self._answers[name]
        if not ok:
            raise value
        return value

    def __iter__(self) -> Iterator[str]:
        return iter(self._answers)

    def __len__(self) -> int:
        return len(self._answers)


def _answer(
    fn: Callable[..., Any], client: Any, handle: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> tuple[bool, Any]:
    """(True, the cached answer), or (False, the ``ValueError``/``KeyError`` it raised, for ``Fetched`` to
    raise where it is read); any other exception goes through ``fetch``."""
    try:
        return True, _cached_on(fn, client, handle, args, kwargs)
    except (ValueError, KeyError) as exc:  # "no rows to compare", "no price for L40S": said where it is read
        return False, exc


def fetch(client: Any, calls: Mapping[str, Call], readers: Sequence[Any] = ()) -> Fetched:
    """The ``calls``' cached answers, computed at once on the ``readers`` (in turn on ``client``
    without two of them). Each answer is cached as ``cached`` would cache it; an exception is not."""
    if len(readers) < 2 or len(calls) < 2:
        return Fetched({name: _answer(c.fn, client, client, c.args, c.kwargs) for name, c in calls.items()})
    ctx = get_script_run_ctx()
    free: queue.SimpleQueue[Any] = queue.SimpleQueue()
    for handle in readers[:READERS]:
        free.put(handle)

    def one(c: Call) -> tuple[bool, Any]:
        if ctx is not None:  # the cache and the session's state, as in the page's own thread
            add_script_run_ctx(threading.current_thread(), ctx)
        handle = free.get()
        try:
            return _answer(c.fn, client, handle, c.args, c.kwargs)
        finally:
            free.put(handle)

    futures: dict[str, Future[tuple[bool, Any]]] = {name: _POOL.submit(one, c) for name, c in calls.items()}
    return Fetched({name: future.result() for name, future in futures.items()})
