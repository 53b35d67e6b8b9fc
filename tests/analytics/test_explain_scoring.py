"""``explain``'s scoring on its own: frames built by hand, no store (``analytics.explain.scoring``
is pure pandas). What a user reads in the evidence table follows from these rules."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from analytics.explain.cost_queries import SCALING_COLUMNS
from analytics.explain.model import Explanation
from analytics.explain.scoring import capacity_evidence, evidence_row, onset, rank, scaling_evidence, split_at

STEP = 10
T0 = pd.Timestamp("2026-12-01 10:00", tz="UTC")


def steps(n: int) -> pd.DatetimeIndex:
    return pd.date_range(T0, periods=n, freq=f"{STEP}s")


def capacity_grid(n: int, brk: int, **after: float) -> pd.DataFrame:
    """A quiet fleet for ``n`` steps; from step ``brk`` on, the columns in ``after`` take their values."""
    grid = pd.DataFrame(
        {
            "kv_avg": 0.2,
            "kv_peak": 0.3,
            "waiting": 0.0,
            "replicas_up": 3.0,
            "preemptions": 0.0,
            "prefix_hit_rate": 0.4,
            "stalled": 0.0,
        },
        index=steps(n),
    )
    for column, value in after.items():
        grid.iloc[brk:, grid.columns.get_loc(column)] = value
    return grid


def by_signal(rows: list[dict]) -> dict[str, dict]:
    return {r["signal"]: r for r in rows}


def test_a_cache_that_fills_at_the_break_scores_the_share_of_steps_it_was_full() -> None:
    grid = capacity_grid(60, 30, kv_avg=0.85, kv_peak=1.0, waiting=4.0)
    rows = by_signal(capacity_evidence(grid, steps(60)[30], steps(60)[-1] + pd.Timedelta(seconds=STEP), STEP))
    kv = rows["KV-cache saturation"]
    assert (kv["before"], kv["after"]) == ("0% of steps", "100% of steps")
    assert kv["score"] == 1.0 and abs(kv["lead_s"]) <= 2 * STEP  # it moved at the break
    assert rows["queueing without KV saturation"]["score"] == 0.0  # the queue is the cache's, not a batch limit
    assert "stalled replicas" not in rows  # none stalled, no row


def test_a_signal_that_moved_well_after_the_break_scores_half() -> None:
    grid = capacity_grid(60, 45, kv_avg=0.85, kv_peak=1.0, waiting=4.0)  # fills 15 steps after the latency broke
    end = steps(60)[-1] + pd.Timedelta(seconds=STEP)
    kv = by_signal(capacity_evidence(grid, steps(60)[30], end, STEP))["KV-cache saturation"]
    assert kv["lead_s"] < -2 * STEP and kv["score"] == 0.5 * 15 / 30  # full in half the steps after the break


def test_stalled_replicas_and_replicas_down_are_capacity_evidence() -> None:
    grid = capacity_grid(60, 30, stalled=1.0, replicas_up=2.0)
    grid.attrs["stalled_replicas"] = {"small-1": (steps(60)[30], 30)}
    rows = by_signal(capacity_evidence(grid, steps(60)[30], steps(60)[-1] + pd.Timedelta(seconds=STEP), STEP))
    assert (
        rows["stalled replicas"]["score"] == 1.0
        and "small-1 (from 10:05:00, 5.0 min)" in rows["stalled replicas"]["detail"]
    )
    assert math.isclose(rows["replicas up"]["score"], 1 - 2 / 3, abs_tol=1e-4)


def test_requests_deferred_for_an_adapter_slot_are_adapter_waiting_not_kv_pressure() -> None:
    # what vLLM 0.32 reports of LoRA slot contention: requests held back ("deferred"), with the cache half
    # full; its lora_requests_info lists no adapter waiting behind another
    grid = capacity_grid(60, 30, waiting=6.0, kv_peak=0.6)
    grid["adapters_deferred"] = [0.0] * 30 + [6.0] * 30
    grid.attrs["max_lora"] = [1]
    rows = rank(capacity_evidence(grid, steps(60)[30], steps(60)[-1] + pd.Timedelta(seconds=STEP), STEP))
    top = rows.iloc[0]
    assert top["signal"] == "adapter waiting" and top["score"] == 1.0
    assert "0.0 -> 6.0 requests deferred" in top["detail"] and "max_loras 1" in top["detail"]
    others = rows.set_index("signal")
    assert others.loc["KV-cache saturation", "score"] == 0.0  # waiting for an adapter, not for KV blocks
    assert others.loc["queueing without KV saturation", "score"] == 0.0


def test_ties_go_to_the_signal_nearer_a_decision() -> None:
    cap = evidence_row("KV-cache saturation", "capacity", "0%", "80%", 0.604, None, None, "", STEP)
    tenant = evidence_row("tenant mix", "mix", "10%", "40%", 0.600, None, None, "", 0)  # within 0.02: a tie
    weak = evidence_row("prefix-cache hit rate", "capacity", "40%", "30%", 0.10, None, None, "", STEP)
    assert list(rank([weak, cap, tenant])["signal"]) == ["tenant mix", "KV-cache saturation", "prefix-cache hit rate"]


def test_a_traffic_change_goes_before_the_cache_it_filled_in_the_same_seconds() -> None:
    switch = T0 + pd.Timedelta(seconds=301)  # the first long request's own arrival time

    def cache(moved: pd.Timestamp) -> dict:
        return evidence_row("KV-cache saturation", "capacity", "5%", "75%", 0.70, moved, 26.0, "", STEP)

    def longs(score: float, resolution: float = 0) -> dict:
        return evidence_row("long-context share", "mix", "3%", "59%", score, switch, 25.0, "", resolution)

    prefix = evidence_row("prefix-cache hit rate", "capacity", "13%", "1%", 0.12, switch, 26.0, "", STEP)
    # the cache moved in the step that holds the switch: the rollout is the cause, the cache how it hurt
    ranked = rank([cache(T0 + pd.Timedelta(seconds=300)), prefix, longs(0.62)])
    assert list(ranked["signal"]) == ["long-context share", "KV-cache saturation", "prefix-cache hit rate"]
    # the cache was full well before the traffic changed: it stays first
    early = rank([cache(T0 + pd.Timedelta(seconds=280)), longs(0.62)])
    assert early["signal"].iloc[0] == "KV-cache saturation"
    # a mix signal that scores far less, or whose move is known to a step only, does not jump the queue
    assert rank([cache(T0 + pd.Timedelta(seconds=300)), longs(0.40)])["signal"].iloc[0] == "KV-cache saturation"
    assert rank([cache(T0 + pd.Timedelta(seconds=300)), longs(0.62, STEP)])["signal"].iloc[0] == "KV-cache saturation"


def test_a_shift_in_arrival_order_is_found_where_it_starts() -> None:
    ts = pd.Series(pd.date_range(T0, periods=40, freq="1s"))
    long = pd.Series(np.r_[np.zeros(25), np.ones(15)])
    assert split_at(ts, long) == T0 + pd.Timedelta(seconds=25)
    assert split_at(ts.head(6), long.head(6)) is None  # too few rows to tell
    assert split_at(ts, long[::-1].reset_index(drop=True), rise=True) is None  # a fall is no rise


def test_the_onset_is_the_earliest_leading_move_and_request_times_win_over_steps() -> None:
    ex = Explanation(
        "p99 ttft", "request log", STEP, pd.DataFrame(), break_at=(T0 + pd.Timedelta(minutes=5)).to_pydatetime()
    )
    exact = T0 + pd.Timedelta(seconds=262)  # a request's own arrival time
    ex.evidence = rank(
        [
            evidence_row("long-context share", "mix", "5%", "35%", 0.8, exact, 38.0, "", 0),
            evidence_row(
                "KV-cache saturation", "capacity", "0%", "70%", 0.7, T0 + pd.Timedelta(seconds=250), 50.0, "", STEP
            ),
        ]
    )
    assert onset(ex) == exact.to_pydatetime()  # the step-resolved move 12 s away is the same move
    ex.evidence = rank([evidence_row("KV-cache saturation", "capacity", "0%", "70%", 0.7, None, None, "", STEP)])
    assert onset(ex) == ex.break_at  # nothing moved before it: the break is the onset


def outs(*rows: tuple[str, str, float, float | None, float | None, float | None]) -> pd.DataFrame:
    """Scale-outs as ``queries.scale_outs`` reads them: (pool, replica, decided s, crossed s, ready s,
    serving s) after T0 (None: not yet)."""

    def at(s: float | None) -> pd.Timestamp:
        return T0 + pd.Timedelta(seconds=s) if s is not None else pd.NaT

    frame = [
        {
            "pool": pool, "kind": "scale_out", "decided_at": at(d), "from_replicas": 1, "to_replicas": 2,
            "signal": "requests_waiting", "value": 3.1, "threshold": 2.0, "crossed_at": at(c), "replica": replica,
            "ready_at": at(r), "serving_at": at(s), "removed_at": pd.NaT, "decision_id": f"{pool}-{d}",
        }
        for pool, replica, d, c, r, s in rows
    ]  # fmt: skip
    return pd.DataFrame(frame, columns=SCALING_COLUMNS)


def test_a_late_scale_out_scores_the_share_of_the_regression_spent_waiting_for_it() -> None:
    # the regression runs 100 s .. 300 s; tiny-small's signal crossed at 95 s, the scale-out was decided at
    # 110 s and its replica first served at 162 s: 52 of the regression's 200 s waited for it
    brk, end = T0 + pd.Timedelta(seconds=100), T0 + pd.Timedelta(seconds=300)
    [row] = scaling_evidence(outs(("tiny-small", "small-1", 110, 95, 150, 162)), brk, end, STEP)
    assert row["signal"] == "late scale-out" and row["kind"] == "capacity"
    assert row["score"] == round(52 / 200, 4)
    assert row["moved_at"] == T0 + pd.Timedelta(seconds=95) and row["lead_s"] == 5.0  # the crossing led the break
    assert (row["before"], row["after"]) == ("1 replica", "scale-out decided 10:01:50, serving +52s")
    assert row["detail"] == (
        "tiny-small: requests_waiting 3.1 > 2 since 10:01:35, decided 10:01:50 (1 -> 2), small-1 ready 10:02:30, "
        "serving 10:02:42 (52 s cold start); 26% of the regression waited for a decided replica"
    )
    # never served: the wait runs to the regression's end; two pools waiting at once count once
    [row] = scaling_evidence(
        outs(("tiny-small", "small-1", 110, 95, None, None), ("tiny-large", "large-1", 150, 140, 200, 250)),
        brk,
        end,
        STEP,
    )
    assert row["score"] == round(190 / 200, 4) and "not serving by the end" in row["after"]
    assert "tiny-large: requests_waiting 3.1 > 2 since 10:02:20" in row["detail"]


def test_a_scale_out_done_before_the_regression_is_no_evidence() -> None:
    brk, end = T0 + pd.Timedelta(seconds=300), T0 + pd.Timedelta(seconds=600)
    assert scaling_evidence(outs(("tiny-small", "small-1", 100, 90, 140, 150)), brk, end, STEP) == []
    assert scaling_evidence(outs(), brk, end, STEP) == []


def test_a_late_scale_out_ranks_with_the_capacity_signals_but_never_sets_the_onset() -> None:
    # KV saturation led the break by 30 s; the scale-out's signal crossed 60 s before it. The regression began
    # when the cache filled, not when the autoscaler noticed: the onset stays with the KV row
    grid = capacity_grid(60, 30, kv_avg=0.95, kv_peak=0.97, waiting=3.0)
    brk, end = steps(60)[33], steps(60)[-1] + pd.Timedelta(seconds=STEP)
    rows = capacity_evidence(grid, brk, end, STEP) + scaling_evidence(
        outs(("tiny-small", "small-1", 340, 270, 400, 430)), brk, end, STEP
    )
    ex = Explanation("p99 ttft", "request log", STEP, pd.DataFrame(), break_at=brk.to_pydatetime())
    ex.evidence = rank(rows)
    assert "late scale-out" in list(ex.evidence["signal"])
    late = ex.evidence.set_index("signal").loc["late scale-out"]
    assert late["score"] == round(90 / 270, 4)
    kv = ex.evidence.set_index("signal").loc["KV-cache saturation"]
    assert kv["moved_at"] == steps(60)[30] and onset(ex) == steps(60)[30]  # not the crossing at 270 s
