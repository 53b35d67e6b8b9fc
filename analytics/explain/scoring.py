"""The evidence, from what ``analytics.explain.queries`` read: pure pandas, no store.

In:  the capacity signals per step, the mix per step and the BubbleUp dimensions, the rows near
     the break, the autoscaler's scale-outs (``queries.scale_outs``), the gateway's shedding
     (``queries.shedding``), the break and the regression's end.
Out: evidence rows (``evidence_row``: signal, kind, before, after, score, moved_at, lead_s,
     detail, resolution_s) scored on one scale, ranked (``rank``), and the onset (``onset``).
     How each signal is scored: ``analytics.explain``'s docstring.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, NamedTuple

import pandas as pd

from analytics.changepoints import best_split
from analytics.explain.model import (
    CAUSE_RATIO,
    EVIDENCE_COLUMNS,
    GATEWAY_SHED,
    HELD_MIN_SHARE,
    LATE_SCALE_OUT,
    MIN_PER_STEP,
    MIX_CHANGE,
    MIX_DIMENSIONS,
    PRESSURE,
    PRIORITY,
    SATURATED,
    Explanation,
)

__all__ = [
    "capacity_evidence",
    "cause_first",
    "evidence_row",
    "mix_evidence",
    "moved_at",
    "onset",
    "rank",
    "rate_evidence",
    "scaling_evidence",
    "shedding_episode",
    "shedding_evidence",
    "split_at",
    "timing",
]


def moved_at(series: pd.Series, break_at: pd.Timestamp, step: int, radius: int = 12) -> pd.Timestamp | None:
    """The signal's own change point nearest the break (within ``radius`` steps around it)."""
    s = series.dropna()
    if len(s) < 6:
        return None
    window = s[
        (s.index >= break_at - pd.Timedelta(seconds=step * radius * 2))
        & (s.index < break_at + pd.Timedelta(seconds=step * radius * 2))
    ]
    if len(window) < 6:
        return None
    k, gain = best_split(window.to_numpy(float), 2)
    return window.index[k] if k > 0 and gain > 0 else None


def timing(moved: pd.Timestamp | None, break_at: pd.Timestamp, step: int) -> tuple[float | None, float]:
    if moved is None:
        return None, 1.0
    lead = (break_at - moved).total_seconds()
    return lead, (1.0 if lead >= -2 * step else 0.5)


def evidence_row(
    signal: str,
    kind: str,
    before: str,
    after: str,
    score: float,
    moved: pd.Timestamp | None,
    lead: float | None,
    detail: str,
    resolution_s: float,
) -> dict[str, Any]:
    """``resolution_s``: how finely ``moved`` is known (0: a request's own time; else the step)."""
    return {
        "signal": signal,
        "kind": kind,
        "before": before,
        "after": after,
        "score": round(float(score), 4),
        "moved_at": moved,
        "lead_s": lead,
        "detail": detail,
        "resolution_s": float(resolution_s),
    }


def split_at(ts: pd.Series, values: pd.Series, rise: bool = True) -> pd.Timestamp | None:
    """The arrival time where ``values`` (in arrival order) shift: the best single split of their
    ranks (a rise when ``rise``); None for fewer than 8 rows or no shift."""
    if len(values) < 8:
        return None
    x = values.rank().to_numpy(float)  # ranks: a few outliers cannot pull the split (0/1 values keep their order)
    k, gain = best_split(x, 3)
    if k <= 0 or gain <= 0 or (rise and x[k:].mean() <= x[:k].mean()):
        return None
    at = pd.Timestamp(ts.iloc[k])
    return at.tz_convert("UTC") if at.tzinfo else at.tz_localize("UTC")


def mix_evidence(
    mix: pd.DataFrame,
    dims: pd.DataFrame,
    break_at: pd.Timestamp,
    step: int,
    long_tokens: float,
    near: pd.DataFrame,
) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    totals = mix[mix["dimension"] == "tenant"].groupby("ts")["requests"].sum()
    for dim, label in [("long", "long-context share"), *MIX_DIMENSIONS.items()]:
        d = dims[dims["dimension"] == dim]
        if d.empty:
            continue
        d = d.assign(diff=d["slow_share"] - d["baseline_share"])
        if dim == "long":
            longs = d[d["value"] == "long"]
            if longs.empty:
                continue
            top = longs.iloc[0]
        else:
            top = d.sort_values("diff", ascending=False).iloc[0]
        on = near["prompt_tokens"] > float(long_tokens) if dim == "long" else near[dim] == str(top["value"])
        up = float(top["after_share"]) >= float(top["baseline_share"])
        moved = split_at(near["ts"], on.astype(float), rise=up)
        resolution = 0.0
        if moved is None:  # too few rows near the break: the per-step shares
            per_step = mix[(mix["dimension"] == dim) & (mix["value"] == top["value"])].set_index("ts")["requests"]
            moved = moved_at((per_step.reindex(totals.index).fillna(0) / totals).sort_index(), break_at, step)
            resolution = step
        lead, factor = timing(moved, break_at, step)
        name = f"prompts > {long_tokens:,.0f} tokens" if dim == "long" else f"{dim} {top['value'] or '(none)'}"
        detail = (
            f"{name}: {top['baseline_share']:.0%} of baseline requests, {top['slow_share']:.0%} of the slow ones "
            f"after the break ({top['after_share']:.0%} of all after)"
        )
        # concentrated among the slow requests (BubbleUp), and more of the traffic than before:
        # a share that did not change says where the slow requests are, not why
        changed = min(1.0, abs(float(top["after_share"]) - float(top["baseline_share"])) / MIX_CHANGE)
        rows.append(
            evidence_row(
                label,
                "mix",
                f"{top['baseline_share']:.0%}",
                f"{top['after_share']:.0%}",
                max(float(top["diff"]), 0.0) * changed * factor,
                moved,
                lead,
                detail,
                resolution,
            )
        )
    return rows


class _Split(NamedTuple):
    """The capacity signals per step, split at the break: what every capacity row is judged on."""

    cap: pd.DataFrame
    before: pd.DataFrame
    after: pd.DataFrame
    break_at: pd.Timestamp
    step: int

    def shares(self, on: pd.Series) -> tuple[float, float]:
        """The share of the steps before and after the break where ``on`` holds."""
        return _frac(self.before, on[self.before.index]), _frac(self.after, on[self.after.index])


def _frac(frame: pd.DataFrame, condition: pd.Series) -> float:
    return float(condition.mean()) if len(frame) else 0.0


def _row(
    sp: _Split, signal: str, moving: pd.Series, before: str, after: str, change: float, detail: str
) -> dict[str, Any]:
    """A capacity row: ``change`` (its worsening, 0 when it got better) scored by when ``moving`` moved."""
    moved = moved_at(moving, sp.break_at, sp.step)
    lead, factor = timing(moved, sp.break_at, sp.step)
    return evidence_row(signal, "capacity", before, after, max(change, 0.0) * factor, moved, lead, detail, sp.step)


def capacity_evidence(
    cap: pd.DataFrame, break_at: pd.Timestamp, after_end: pd.Timestamp, step: int
) -> list[dict[str, Any]]:
    before = cap[cap.index < break_at]
    after = cap[(cap.index >= break_at) & (cap.index < after_end)]
    if before.empty or after.empty:
        return []
    sp = _Split(cap, before, after, break_at, step)
    adapter_wait = _adapter_wait(cap)
    rows, kv_on = _kv_rows(sp, adapter_wait)
    queue_on = (cap["waiting"] > 0.5) & ~adapter_wait
    if kv_on is not None:
        queue_on &= ~kv_on
    q_b, q_a = sp.shares(queue_on)
    rows.append(
        _row(
            sp,
            "queueing without KV saturation",
            cap["waiting"],
            f"{q_b:.0%} of steps",
            f"{q_a:.0%} of steps",
            q_a - q_b,
            f"requests waiting while no replica's KV cache was {PRESSURE:.0%} used: batch or compute limits",
        )
    )
    hb, ha = before["prefix_hit_rate"].mean(), after["prefix_hit_rate"].mean()
    if pd.notna(hb) and pd.notna(ha):
        rows.append(
            _row(
                sp,
                "prefix-cache hit rate",
                cap["prefix_hit_rate"],
                f"{hb:.0%}",
                f"{ha:.0%}",
                hb - ha,
                "a lower hit rate means more prompt tokens to compute",
            )
        )
    rows.extend(_stalled_rows(sp))
    rows.extend(_draft_rows(cap, before, after, break_at, step))
    rows.extend(_adapter_rows(sp, adapter_wait))
    ub, ua = before["replicas_up"].mean(), after["replicas_up"].mean()
    if pd.notna(ub) and ub > 0:
        rows.append(
            _row(
                sp,
                "replicas up",
                cap["replicas_up"],
                f"{ub:.1f}",
                f"{ua:.1f}",
                1 - ua / ub,
                "fewer replicas serving the same traffic",
            )
        )
    return rows


def _adapter_wait(cap: pd.DataFrame) -> pd.Series:
    """The steps where requests waited for a LoRA adapter slot: they wait for the adapter, not for
    KV blocks or compute."""
    adapter_wait = pd.Series(False, index=cap.index)
    if "adapters_blocked" in cap:  # an adapter listed waiting while every slot ran another (the simulator's)
        adapter_wait |= cap["adapters_blocked"] > 0
    if "adapters_deferred" in cap:  # requests held back for a slot (vLLM's waiting reason "deferred")
        adapter_wait |= cap["adapters_deferred"] > 0.5
    return adapter_wait


def _kv_rows(sp: _Split, adapter_wait: pd.Series) -> tuple[list[dict[str, Any]], pd.Series | None]:
    """KV-cache saturation's row and the steps it was on (none without the KV gauges)."""
    cap, before, after, step = sp.cap, sp.before, sp.after, sp.step
    if "kv_peak" not in cap:
        return [], None
    # full, or so full that the next request's blocks do not fit: requests wait at half use
    on = (cap["kv_peak"] >= SATURATED) | ((cap["waiting"] > 0.5) & (cap["kv_peak"] >= PRESSURE) & ~adapter_wait)
    f_b, f_a = sp.shares(on)
    detail = (
        f"KV usage {before['kv_avg'].mean():.0%} -> {after['kv_avg'].mean():.0%} on average; a replica at "
        f">= {SATURATED:.0%}, or >= {PRESSURE:.0%} with requests waiting, in {f_b:.0%} -> {f_a:.0%} of steps; "
        f"{before['waiting'].mean():.1f} -> "
        f"{after['waiting'].mean():.1f} requests waiting; "
        f"{before['preemptions'].sum() / max(len(before) * step, 1) * 60:.1f} -> "
        f"{after['preemptions'].sum() / max(len(after) * step, 1) * 60:.1f} preemptions/min"
    )
    row = _row(
        sp, "KV-cache saturation", cap["kv_avg"], f"{f_b:.0%} of steps", f"{f_a:.0%} of steps", f_a - f_b, detail
    )
    return [row], on


def _stalled_rows(sp: _Split) -> list[dict[str, Any]]:
    """Stalled replicas' row, where any stalled (``analytics.stalls``)."""
    cap, step = sp.cap, sp.step
    if "stalled" not in cap:
        return []
    s_b, s_a = sp.shares(cap["stalled"] > 0)
    if not (s_a > 0 or s_b > 0):
        return []
    who = sorted((cap.attrs.get("stalled_replicas") or {}).items(), key=lambda item: -item[1][1])
    named = ", ".join(f"{r} (from {first:%H:%M:%S}, {n * step / 60:.1f} min)" for r, (first, n) in who[:5])
    detail = (
        f"replicas that held requests and generated no token: {named or 'none named'}; their "
        "requests wait, the others take the rest"
    )
    return [
        _row(sp, "stalled replicas", cap["stalled"], f"{s_b:.0%} of steps", f"{s_a:.0%} of steps", s_a - s_b, detail)
    ]


def _adapter_rows(sp: _Split, adapter_wait: pd.Series) -> list[dict[str, Any]]:
    """Adapter waiting's row, where requests waited for a LoRA adapter slot at all."""
    cap, before, after = sp.cap, sp.before, sp.after
    if not bool(adapter_wait.any()):
        return []
    f_b, f_a = sp.shares(adapter_wait)
    waited = sorted((cap.attrs.get("blocked_adapters") or {}).items(), key=lambda item: -item[1])
    slots = "/".join(str(m) for m in cap.attrs.get("max_lora") or []) or "?"
    detail = (
        f"requests waited for a LoRA adapter slot (max_loras {slots}) in {f_b:.0%} -> {f_a:.0%} of steps"
        + (
            f", {before['adapters_deferred'].mean():.1f} -> {after['adapters_deferred'].mean():.1f} requests deferred"
            if "adapters_deferred" in cap
            else ""
        )
        + (f"; adapters waiting most: {', '.join(name for name, _n in waited[:4])}" if waited else "")
        + ": more adapters wanted at once than slots, so their requests wait and are swapped in turn"
    )
    moving = adapter_wait.astype(float)
    return [_row(sp, "adapter waiting", moving, f"{f_b:.0%} of steps", f"{f_a:.0%} of steps", f_a - f_b, detail)]


def _draft_rows(
    cap: pd.DataFrame, before: pd.DataFrame, after: pd.DataFrame, break_at: pd.Timestamp, step: int
) -> list[dict[str, Any]]:
    """Speculative decoding's acceptance: a drop means fewer tokens per decode step."""
    if "draft_tokens" not in cap or not (cap["draft_tokens"].fillna(0) > 0).any():
        return []
    tb, ta = before["draft_tokens"].sum(), after["draft_tokens"].sum()
    if not (tb > 0 and ta > 0):
        return []
    ab, aa = before["accepted"].sum() / tb, after["accepted"].sum() / ta
    moved = moved_at(cap["draft_acceptance"], break_at, step)
    lead, factor = timing(moved, break_at, step)
    return [
        evidence_row(
            "draft acceptance",
            "capacity",
            f"{ab:.0%}",
            f"{aa:.0%}",
            max(ab - aa, 0.0) * factor,
            moved,
            lead,
            f"speculative decoding accepted {ab:.0%} -> {aa:.0%} of its draft tokens: each decode step emits "
            "fewer tokens, so inter-token latency and the cost per output token rise (the text became harder "
            "for the draft to predict)",
            step,
        )
    ]


def rate_evidence(
    mix: pd.DataFrame, break_at: pd.Timestamp, after_end: pd.Timestamp, step: int
) -> list[dict[str, Any]]:
    totals = mix[mix["dimension"] == "tenant"].groupby("ts")["requests"].sum().sort_index() / step
    b, a = (
        totals[totals.index < break_at].mean(),
        totals[(totals.index >= break_at) & (totals.index < after_end)].mean(),
    )
    if not (pd.notna(b) and b > 0 and pd.notna(a)):
        return []
    moved = moved_at(totals, break_at, step)
    lead, factor = timing(moved, break_at, step)
    return [
        evidence_row(
            "request rate",
            "mix",
            f"{b:.2f}/s",
            f"{a:.2f}/s",
            min(max(a / b - 1, 0.0), 1.0) * factor,
            moved,
            lead,
            "more requests per second",
            step,
        )
    ]


def scaling_evidence(
    outs: pd.DataFrame, break_at: pd.Timestamp, after_end: pd.Timestamp, step: int
) -> list[dict[str, Any]]:
    """The late scale-out's row: the share of the regression (break .. its end) spent waiting for a
    replica the autoscaler had decided on (each scale-out from its decision to its replica's first
    token, or to the regression's end where it never served), its cold start in words; timed at
    when its signal crossed the threshold. No row where no scale-out waited inside the regression."""
    span = (after_end - break_at).total_seconds()
    if outs.empty or span <= 0:
        return []
    waits = []
    for r in ({str(k): v for k, v in row.items()} for row in outs.sort_values("decided_at").to_dict("records")):
        decided = pd.Timestamp(r["decided_at"])
        served = pd.Timestamp(r["serving_at"]) if pd.notna(r["serving_at"]) else None
        a, b = max(decided, break_at), min(served if served is not None else after_end, after_end)
        if b > a:
            waits.append((a, b, r, decided, served))
    if not waits:
        return []
    covered, reach = 0.0, break_at
    for a, b, *_ in sorted(waits, key=lambda w: w[0]):  # the union of the waits: two pools waiting count once
        covered += max((b - max(a, reach)).total_seconds(), 0.0)
        reach = max(reach, b)
    _a, _b, first, decided, served = waits[0]
    crossed = pd.Timestamp(first["crossed_at"]) if pd.notna(first["crossed_at"]) else decided
    lead = (break_at - crossed).total_seconds()
    after = f"scale-out decided {decided:%H:%M:%S}, " + (
        f"serving +{(served - decided).total_seconds():.0f}s" if served is not None else "not serving by the end"
    )
    detail = "; ".join(_cold_start(r, d, s) for _a, _b, r, d, s in waits)
    detail += f"; {covered / span:.0%} of the regression waited for a decided replica"
    before = f"{int(first['from_replicas'])} replica{'s' if int(first['from_replicas']) != 1 else ''}"
    return [evidence_row(LATE_SCALE_OUT, "capacity", before, after, covered / span, crossed, lead, detail, 0.0)]


def shedding_evidence(
    shed: pd.DataFrame, break_at: pd.Timestamp, after_end: pd.Timestamp, step: int
) -> list[dict[str, Any]]:
    """The gateway's shedding (``queries.shedding``'s rows): the share of the requests it shed before
    the break and in the regression, scored by its rise; the detail names the reasons and the model
    it shed most of ("the gateway shed 18% of requests (queue-time budget) while tiny-small was
    saturated": admission by queue time sheds a model whose estimated wait is past its budget, which
    is a saturated pool). No row where nothing was shed in the regression."""
    if shed.empty:
        return []
    ts = pd.to_datetime(shed["ts"], utc=True)
    ends = ts + pd.Timedelta(seconds=step)  # a step that holds the break counts as after it
    before, after = shed[ends <= break_at], shed[(ends > break_at) & (ts < after_end)]
    if after.empty or after["shed"].sum() <= 0:
        return []
    share_b = float(before["shed"].sum() / before["requests"].sum()) if before["requests"].sum() else 0.0
    total = float(after["requests"].sum())
    share_a = float(after["shed"].sum()) / total
    reasons = {
        "queue-time budget": after["shed_queue_time"].sum(),
        "tenant over its share": after["shed_tenant_share"].sum(),
    }
    named = [(name, float(n) / total) for name, n in reasons.items() if n > 0]
    why = named[0][0] if len(named) == 1 else ", ".join(f"{name} {share:.0%}" for name, share in named)
    model = str(after.groupby("model")["shed"].sum().idxmax())
    per_step = _shed_per_step(shed)
    moved = moved_at(per_step["shed"] / per_step["requests"], break_at, step)
    lead, factor = timing(moved, break_at, step)
    detail = f"the gateway shed {share_a:.0%} of requests ({why}) while {model} was saturated"
    score = max(share_a - share_b, 0.0) * factor
    return [
        evidence_row(
            GATEWAY_SHED, "admission", f"{share_b:.0%} shed", f"{share_a:.0%} shed", score, moved, lead, detail, step
        )
    ]


def shedding_episode(shed: pd.DataFrame, step: int) -> tuple[pd.Timestamp, pd.Timestamp] | None:
    """When the gateway shed (``queries.shedding``'s rows), for a window whose latency did not rise:
    from the first to the end of the last step whose shed share is at least half the peak step's.
    None where it shed under ``HELD_MIN_SHARE`` of that episode's requests or fewer than
    ``MIN_PER_STEP`` requests in all (a stray 429)."""
    if shed.empty or shed["shed"].sum() <= 0:
        return None
    per_step = _shed_per_step(shed)
    per_step = per_step[per_step["requests"] > 0]
    share = per_step["shed"] / per_step["requests"]
    high = share[share >= share.max() / 2].index
    first, last = high.min(), high.max() + pd.Timedelta(seconds=step)
    episode = per_step[(per_step.index >= first) & (per_step.index < last)]
    if episode["shed"].sum() < max(HELD_MIN_SHARE * episode["requests"].sum(), MIN_PER_STEP):
        return None
    return first, last


def _shed_per_step(shed: pd.DataFrame) -> pd.DataFrame:
    """``queries.shedding``'s rows summed over models per step: ``shed`` and ``requests``, by ``ts``."""
    return shed.assign(ts=pd.to_datetime(shed["ts"], utc=True)).groupby("ts")[["shed", "requests"]].sum().sort_index()


def _cold_start(r: dict[str, Any], decided: pd.Timestamp, served: pd.Timestamp | None) -> str:
    """'tiny-small: requests_waiting 3.1 > 2 since 10:02:55, decided 10:03:10, small-1 ready 10:03:52,
    serving 10:04:02 (52 s cold start)'."""
    signal = f"{r['signal']} {float(r['value']):.3g} > {float(r['threshold']):g}" if r["signal"] else "a signal"
    since = f" since {pd.Timestamp(r['crossed_at']):%H:%M:%S}" if pd.notna(r["crossed_at"]) else ""
    text = f"{r['pool']}: {signal}{since}, decided {decided:%H:%M:%S} ({r['from_replicas']} -> {r['to_replicas']})"
    who = f"{r['replica']} " if r["replica"] else "its replica "
    if pd.notna(r["ready_at"]):
        text += f", {who}ready {pd.Timestamp(r['ready_at']):%H:%M:%S}"
        who = ""
    if served is None:
        return text + f", {who}not serving by the end"
    return text + f", {who}serving {served:%H:%M:%S} ({(served - decided).total_seconds():.0f} s cold start)"


def onset(ex: Explanation) -> datetime:
    """When the regression began: the earliest move of the top two signals, if before the break.

    A move found on per-step values (a gauge, a per-step share) is known to a few steps; where it
    falls within that of a move found on the requests themselves, the requests' time is used."""
    assert ex.break_at is not None, "an onset is looked for before a break found"
    # the autoscaler's and the gateway's answers, not causes
    top = ex.evidence[~ex.evidence["signal"].isin((LATE_SCALE_OUT, GATEWAY_SHED))].head(2)
    leading = top[(top["score"] > 0.1) & (top["lead_s"].fillna(-1) >= 0)]
    if not len(leading):
        return ex.break_at
    moves = [(pd.Timestamp(t), float(r)) for t, r in zip(leading["moved_at"], leading["resolution_s"], strict=True)]
    exact = [t for t, r in moves if r == 0]
    kept = [t for t, r in moves if r == 0 or not any(abs((t - e).total_seconds()) <= 3 * r for e in exact)]
    return min(ex.break_at, *(t.to_pydatetime() for t in kept))


def rank(rows: list[dict[str, Any]]) -> pd.DataFrame:
    """The rows by score, ties (within 0.02) to the signal nearer a decision (``PRIORITY``); then
    ``cause_first``; the gateway's shedding (an answer to the regression, not a cause) after the rest."""
    columns = EVIDENCE_COLUMNS
    if not rows:
        return pd.DataFrame(columns=columns)
    df = pd.DataFrame(rows, columns=columns)
    df["_tie"] = (df["score"] / 0.02).round()
    df["_priority"] = df["signal"].map({s: i for i, s in enumerate(PRIORITY)}).fillna(len(PRIORITY))
    df = df.sort_values(["_tie", "_priority"], ascending=[False, True], kind="stable", ignore_index=True)
    answer = df["signal"] == GATEWAY_SHED
    ranked = cause_first(df[~answer].drop(columns=["_tie", "_priority"]).reset_index(drop=True))
    if not answer.any():
        return ranked
    return pd.concat([ranked, df[answer].drop(columns=["_tie", "_priority"])], ignore_index=True)


def cause_first(df: pd.DataFrame) -> pd.DataFrame:
    """The traffic before its effect: where the top row is a capacity signal and a traffic-mix row
    scores at least ``CAUSE_RATIO`` of it, moved on the requests themselves (resolution 0), and the
    capacity signal did not move before it (by more than its own step), the mix row goes first. The
    traffic is the fleet's input and the cache its response: a long-context rollout that overloads
    every replica fills the caches in the same seconds (seen on real engines: KV-cache saturation
    5 % -> 75 % of steps, scored 0.70, moved in the step of the switch; long-context share 3 % ->
    59 %, 0.62, from the switch's first request), and the cache is how it hurt, not why."""
    if len(df) < 2 or df["kind"].iloc[0] != "capacity" or pd.isna(df["moved_at"].iloc[0]):
        return df
    top = df.iloc[0]
    cap_moved = pd.Timestamp(top["moved_at"]) + pd.Timedelta(seconds=float(top["resolution_s"]))
    for i in range(1, len(df)):
        row = df.iloc[i]
        if (
            row["kind"] == "mix"
            and float(row["resolution_s"]) == 0
            and not pd.isna(row["moved_at"])
            and float(row["score"]) >= CAUSE_RATIO * float(top["score"])
            and pd.Timestamp(row["moved_at"]) <= cap_moved
        ):
            first: pd.DataFrame = pd.concat([df.iloc[[i]], df.drop(index=df.index[i])], ignore_index=True)
            return first
    return df
