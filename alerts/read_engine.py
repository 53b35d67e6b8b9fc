"""Signal readers of the engines' own metrics: scrape health, KV cache, queue, preemptions,
stalls, speculative decoding and LoRA adapters.

In:  a ``Context`` (the ClickHouse client), a signal's parsed parameters and the evaluation time.
Out: the ``Sample`` list of each signal (``alerts.signals.SIGNALS`` names which reader is which
     signal); every number comes from ``analytics`` (``metrics``, ``health``, ``saturation``,
     ``stalls``, ``specdecode``, ``adapters``). A replica a scale-in removed (``analytics.health``:
     retired) is not a target that is down: the scrape signals leave it out.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from alerts.reading import Context, Params, Reader, Sample, frame, window

__all__ = [
    "acceptance_drop",
    "adapter_waiting",
    "deferred",
    "draft_acceptance",
    "gauge",
    "preemptions",
    "replica_up",
    "scrape_success",
    "stalled",
    "waiting_growth",
]


def gauge(metric: str, column: str) -> Reader:
    """A reader of gauge ``metric``'s ``column`` (``max``, ``avg``) per ``by`` over the window."""

    def fn(ctx: Context, p: Params, at: datetime) -> list[Sample]:
        from analytics.metrics import gauge_summary

        start, end = window(at, p)
        return frame(gauge_summary(ctx.client, metric, start, end, p["by"]), [p["by"]], column)

    return fn


def replica_up(ctx: Context, p: Params, at: datetime) -> list[Sample]:
    """1 or 0 per scrape target; a replica a scale-in removed (retired) has no sample: not down."""
    from analytics.health import current, scrape_health

    start, end = window(at, p)
    df = current(scrape_health(ctx.client, start, end)).copy()
    df["up_value"] = df["up"].astype(float)
    return frame(df, ["replica", "instance", "job"], "up_value")


def scrape_success(ctx: Context, p: Params, at: datetime) -> list[Sample]:
    from analytics.health import current, scrape_health

    start, end = window(at, p)
    return frame(current(scrape_health(ctx.client, start, end)), ["replica", "instance", "job"], "up_share")


def waiting_growth(ctx: Context, p: Params, at: datetime) -> list[Sample]:
    from analytics.metrics import gauge_summary
    from analytics.saturation import WAITING

    start, end = window(at, p)
    middle = start + (end - start) / 2
    before = gauge_summary(ctx.client, WAITING, start, middle, p["by"])[[p["by"], "avg"]]
    after = gauge_summary(ctx.client, WAITING, middle, end, p["by"])[[p["by"], "avg"]]
    both = after.merge(before, on=p["by"], suffixes=("_after", "_before"))
    both["growth"] = both["avg_after"] - both["avg_before"]
    return frame(both, [p["by"]], "growth")


def preemptions(ctx: Context, p: Params, at: datetime) -> list[Sample]:
    from analytics.metrics import counter_increase
    from analytics.saturation import PREEMPTIONS

    start, end = window(at, p)
    df = counter_increase(ctx.client, PREEMPTIONS, start, end, p["by"])
    df["rate"] = df["increase"] / p["window"]
    return frame(df, [p["by"]], "rate")


def stalled(ctx: Context, p: Params, at: datetime) -> list[Sample]:
    from analytics.stalls import stalls

    start, end = window(at, p)
    found = stalls(ctx.client, start, end)
    found = found[found["ongoing"]]
    return [
        Sample({"replica": str(r["replica"]), "model": str(r["model"])}, float(r["seconds"]))
        for r in found.to_dict("records")  # none (and no columns) when nothing is ongoing
    ]


def draft_acceptance(ctx: Context, p: Params, at: datetime) -> list[Sample]:
    from analytics.specdecode import acceptance

    start, end = window(at, p)
    df = acceptance(ctx.client, start, end, p["by"])
    df = df[df["draft_tokens"] >= p["min_draft_tokens"]]
    return frame(df, [p["by"]], "acceptance_rate")


def acceptance_drop(ctx: Context, p: Params, at: datetime) -> list[Sample]:
    """The acceptance rate of the ``baseline`` before the window minus the window's (points, 0-1)."""
    from analytics.specdecode import acceptance

    start, end = window(at, p)
    now = acceptance(ctx.client, start, end, p["by"])
    then = acceptance(ctx.client, start - timedelta(seconds=p["baseline"]), start, p["by"])
    both = now.merge(then, on=p["by"], suffixes=("", "_then"))
    both = both[(both["draft_tokens"] >= p["min_draft_tokens"]) & (both["draft_tokens_then"] >= p["min_draft_tokens"])]
    both["drop"] = both["acceptance_rate_then"] - both["acceptance_rate"]
    return [
        Sample(
            {p["by"]: str(getattr(r, p["by"]))},
            float(r.drop),
            {"before": float(r.acceptance_rate_then), "after": float(r.acceptance_rate)},
        )
        for r in both.itertuples(index=False)
    ]


def deferred(ctx: Context, p: Params, at: datetime) -> list[Sample]:
    from analytics.adapters import deferred as deferred_avg

    start, end = window(at, p)
    return frame(deferred_avg(ctx.client, start, end), ["replica"], "deferred_avg")


def adapter_waiting(ctx: Context, p: Params, at: datetime) -> list[Sample]:
    from analytics.adapters import residency

    start, end = window(at, p)
    return frame(residency(ctx.client, start, end), ["replica", "adapter"], "blocked_share")
