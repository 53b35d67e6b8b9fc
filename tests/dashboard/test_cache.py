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
