"""dashboard.cache: a page's reads at once on the reader clients, cached as one at a time would be."""

from __future__ import annotations

import threading

import pytest
import streamlit as st

from dashboard.cache import cached, call, fetch


class Client:
    def __init__(self, name: str) -> None:
        self.name = name


def test_reads_at_once_run_on_the_readers_and_are_what_a_later_read_finds() -> None:
    st.cache_data.clear()
    ran: list[tuple[str, int, str]] = []

    def doubled(client: Client, x: int) -> int:
        ran.append((client.name, x, threading.current_thread().name))
        if x < 0:
            raise ValueError("no negative numbers here")
        return 2 * x

    page, readers = Client("page"), [Client("r1"), Client("r2")]
    got = fetch(page, {"a": call(doubled, 1), "b": call(doubled, 2), "bad": call(doubled, -1)}, readers)
    assert (got["a"], got["b"]) == (2, 4)
    with pytest.raises(ValueError, match="no negative"):  # an answer that is an error is raised where it is read
        got["bad"]
    assert {name for name, _x, _thread in ran} <= {"r1", "r2"}  # on the readers, not the page's client
    assert all(thread.startswith("fleetscope-read") for _n, _x, thread in ran)
    # the page's own read of the same call finds the answer: nothing runs again
    assert cached(doubled, page, 2) == 4 and len(ran) == 3
    # without two readers: in turn, on the page's client
    alone = fetch(page, {"c": call(doubled, 3), "d": call(doubled, 4)})
    assert (alone["c"], alone["d"]) == (6, 8) and [n for n, x, _t in ran if x in (3, 4)] == ["page", "page"]


def test_an_error_is_not_cached_as_an_answer() -> None:
    """A call that raised runs again on the next rerun (the store may be back, the row may have arrived);
    once it answers, the answer is cached."""
    st.cache_data.clear()
    ran: list[int] = []

    def flaky(client: Client, x: int) -> int:
        ran.append(x)
        if len(ran) < 3:
            raise ValueError("no rows yet") if len(ran) == 1 else KeyError("no price yet")
        return x + 1

    page = Client("page")
    with pytest.raises(ValueError, match="no rows yet"):
        cached(flaky, page, 1)
    got = fetch(page, {"a": call(flaky, 1)})  # fetch does not keep it either: it runs again
    with pytest.raises(KeyError, match="no price yet"):
        got["a"]
    assert cached(flaky, page, 1) == 2 and ran == [1, 1, 1]
    assert cached(flaky, page, 1) == 2 and fetch(page, {"a": call(flaky, 1)})["a"] == 2 and len(ran) == 3


def test_an_error_read_at_once_on_the_readers_is_not_cached_either() -> None:
    st.cache_data.clear()
    ran: list[str] = []

    def once_broken(client: Client, x: int) -> int:
        ran.append(client.name)
        if len(ran) == 1:
            raise ValueError("the store is away")
        return x

    page, readers = Client("page"), [Client("r1"), Client("r2")]
    got = fetch(page, {"bad": call(once_broken, 1), "other": call(lambda c: 0)}, readers)
    with pytest.raises(ValueError, match="the store is away"):
        got["bad"]
    assert cached(once_broken, page, 1) == 1 and len(ran) == 2  # computed again, on the page's client
