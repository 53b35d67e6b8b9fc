"""The words of a cost explanation: each part of the change in a few words (the sentence) and in
full (the decomposition's ``detail``), from the two periods' tables.

In:  ``Words``: the view (``analytics.explain.cost_model.View``), both periods' per-pool tables (spend,
     tokens, the view's tokens and part, other tokens, replicas, idle share; per hour), the view's
     tokens per hour on each side, the tenants' flows per hour, the movers and the autoscaler's
     scale-outs and scale-ins in the periods (``cost_queries.scaling``); for the sentence, the
     ``CostExplanation`` (levels, break, evidence).
Out: ``sentence``: "Cost per 1M tokens of ... rose from $a to $b at ...; consistent with ...", each
     quoted part in dollars per 1M tokens with its share of the change, or, where parts offset
     each other, in dollars with "partly offset by" (a share above 100 % is never quoted);
     ``detail``: a part in full, for the table (a pool's spend part names its scale-outs:
     "scaled out 1 -> 2 at 06:33:10 (kv_cache_usage 0.86 > 0.8), large-1 ready +40 s, serving
     +41 s"); ``scaled``: a pool's scale events in a few words, which the sentence says for every
     pool the view pays for, whatever the spend part's rank. No reads.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import pandas as pd

from analytics.explain.cost_model import CostExplanation, View, records, to_float

__all__ = ["MOVED", "Words", "detail", "scaled", "scaling_note", "sentence"]

MOVED = 0.05  # a share of a tenant's tokens that changed pool by this much is a move


def _money(usd_per_million: float) -> str:
    return f"{'+' if usd_per_million >= 0 else '-'}${abs(usd_per_million):,.4g}"


def _pct(before: float, after: float) -> str:
    if before <= 0:
        return "from none" if after > 0 else "none"
    change = (after / before - 1) * 100
    return "unchanged" if abs(change) < 0.5 else f"{change:+.0f}%"


def _fewer(before: float, after: float) -> str:
    if before <= 0:
        return "new"
    return f"{abs(after / before - 1):.0%} {'fewer' if after < before else 'more'}"


class Words(NamedTuple):
    """What the parts' words are made of: both periods' tables, the flows and the movers."""

    view: View
    before: pd.DataFrame
    after: pd.DataFrame
    x: tuple[float, float]
    flows: pd.DataFrame  # per tenant and pool, per hour
    movers: pd.DataFrame
    scaling: pd.DataFrame = pd.DataFrame()  # cost_queries.scaling: the pools' scale-outs and scale-ins


def _signal(r: dict[str, object]) -> str:
    """What decided, in words: 'kv_cache_usage 0.86 > 0.8' (min/max replicas: the bound alone)."""
    signal, value, threshold = str(r["signal"]), to_float(r["value"]), to_float(r["threshold"])
    if not signal or signal in ("min_replicas", "max_replicas"):
        return signal.replace("_", " ") or "no signal recorded"
    return f"{signal} {value:.3g} {'>' if r['kind'] == 'scale_out' else '<'} {threshold:g}"


def scaled(scaling: pd.DataFrame, pool: str, full: bool = False) -> str:
    """``pool``'s scale events in the periods in words ("" without any): in the sentence
    "tiny-large scaled out 1 -> 2 replicas (+1) at 06:33 (kv_cache_usage 0.86 > 0.8)"; ``full``:
    each decision to the second with its replica's ready and serving times after it."""
    if scaling.empty:
        return ""
    rows = records(scaling[scaling["pool"] == pool].sort_values("decided_at"))
    said = []
    for kind, verb in (("scale_out", "scaled out"), ("scale_in", "scaled in")):
        mine = [r for r in rows if r["kind"] == kind]
        if not mine:
            continue
        a, b = int(to_float(mine[0]["from_replicas"])), int(to_float(mine[-1]["to_replicas"]))
        if not full:
            at = ", ".join(f"{pd.Timestamp(r['decided_at']):%H:%M}" for r in mine)
            said.append(f"{pool} {verb} {a} -> {b} replicas ({b - a:+d}) at {at} ({_signal(mine[0])})")
            continue
        for r in mine:
            text = f"{verb} {int(to_float(r['from_replicas']))} -> {int(to_float(r['to_replicas']))} at "
            text += f"{pd.Timestamp(r['decided_at']):%H:%M:%S} ({_signal(r)})"
            steps = [
                f"{name} +{(pd.Timestamp(r[column]) - pd.Timestamp(r['decided_at'])).total_seconds():.0f} s"
                for name, column in (("ready", "ready_at"), ("serving", "serving_at"), ("removed", "removed_at"))
                if pd.notna(r[column])
            ]
            who = f"{r['replica']} " if r["replica"] else ""
            said.append(text + (f", {who}{', '.join(steps)}" if steps else f", {who}not ready by the end"))
    return "; ".join(said)


def _at(t: pd.DataFrame, pool: str, column: str) -> float:
    return to_float(t.at[pool, column]) if pool in t.index and column in t.columns else 0.0


def _moves(w: Words) -> tuple[list[str], list[str]]:
    """The pools the view's tokens left and arrived in (its share of its tokens by this much)."""
    b, a = w.before, w.after
    pools = sorted(set(b.index) | set(a.index))
    shares = {
        p: (_at(b, p, "view_tokens") / max(w.x[0], 1e-12), _at(a, p, "view_tokens") / max(w.x[1], 1e-12)) for p in pools
    }
    left = [p for p, (sb, sa) in shares.items() if sb - sa > MOVED]
    arrived = [p for p, (sb, sa) in shares.items() if sa - sb > MOVED]
    return left, arrived


def _others_moved(w: Words, pool: str) -> list[str]:
    """Other tenants whose tokens left or arrived in ``pool``, biggest first, in words."""
    if w.flows.empty:
        return []
    f = w.flows[w.flows["pool"] == pool]
    if w.view.by == "tenant":
        f = f[f["tenant"] != w.view.value]
    f = f.assign(change=f["tokens_after"] - f["tokens_before"]).sort_values("change", key=abs, ascending=False)
    out = []
    for r in records(f.head(2)):
        if abs(to_float(r["change"])) <= MOVED * max(to_float(r["tokens_before"]), 1.0):
            continue
        before, after = to_float(r["tokens_before"]), to_float(r["tokens_after"])
        went = "left" if after <= 0 else "arrived" if before <= 0 else f"per hour {_pct(before, after)}"
        mover = w.movers[w.movers["tenant"] == r["tenant"]] if len(w.movers) else w.movers
        how = ""
        if len(mover) and mover.iloc[0]["example"]:
            how = f" (route {mover.iloc[0]['route']}: {mover.iloc[0]['example']})"
        out.append(f"tenant {r['tenant']}'s tokens {went}{how}")
    return out


def _label(kind: str, pool: str, w: Words) -> str:
    """A part in a few words, for the sentence."""
    if kind == "spend":
        return f"{pool}'s spend per hour {_pct(_at(w.before, pool, 'spend'), _at(w.after, pool, 'spend'))}"
    if kind == "volume":
        ob, oa = _at(w.before, pool, "other_weighted"), _at(w.after, pool, "other_weighted")
        return f"{pool}'s spend shared with {_fewer(ob, oa)} tokens of others"
    left, arrived = _moves(w) if w.view.payer else ([], [])
    if left or arrived:
        moved = f"{w.view.words}'s tokens moving" + (f" from {', '.join(left)}" if left else "")
        moved += f" to {', '.join(arrived)}" if arrived else ""
        pct = w.x[1] / w.x[0] - 1 if w.x[0] > 0 else 0.0
        return moved + (f", {_fewer(*w.x)} of them" if abs(pct) >= MOVED else "")
    if w.view.by == "fleet":
        return f"the fleet serving {_fewer(*w.x)} tokens per hour"
    if not w.view.payer:
        return f"{w.view.value} serving {_fewer(*w.x)} tokens per hour"
    return f"{w.view.words} sending {_fewer(*w.x)} tokens per hour"


def detail(kind: str, pool: str, w: Words) -> str:
    """A part in full, for the table."""
    b, a = w.before, w.after
    if kind == "spend":
        rb, ra = _at(b, pool, "replicas"), _at(a, pool, "replicas")
        ib, ia = (to_float(t.at[pool, "idle_share"]) if pool in t.index else math.nan for t in (b, a))
        idle = f", idle {ib:.0%} -> {ia:.0%}" if not (math.isnan(ib) or math.isnan(ia)) else ""
        spend = _pct(_at(b, pool, "spend"), _at(a, pool, "spend"))
        scaling = scaled(w.scaling, pool, full=True)
        return f"{pool}'s spend per hour {spend}: replicas up {rb:.1f} -> {ra:.1f}{idle}" + (
            f"; {scaling}" if scaling else ""
        )
    if kind == "volume":
        ob, oa = _at(b, pool, "other_weighted"), _at(a, pool, "other_weighted")
        text = f"{pool}'s other weighted tokens per hour {_pct(ob, oa)}, its spend per hour "
        text += _pct(_at(b, pool, "spend"), _at(a, pool, "spend"))
        who = _others_moved(w, pool)
        return text + ("; " + "; ".join(who) if who else "")
    text = f"{'the fleet' if w.view.by == 'fleet' else w.view.value if not w.view.payer else w.view.words}'s"
    text += f" tokens per hour {_pct(*w.x)}"
    pools = sorted(set(b.index) | set(a.index))
    per_pool = [
        f"{p} {_pct(_at(b, p, 'view_tokens'), _at(a, p, 'view_tokens'))}"
        for p in pools
        if _at(b, p, "view_tokens") > 0 or _at(a, p, "view_tokens") > 0
    ]
    if len(per_pool) > 1 or w.view.by == "fleet":
        text += " (" + ", ".join(per_pool) + ")"
    left, arrived = _moves(w) if w.view.payer else ([], [])
    for p in arrived:
        sb, sa = _at(b, p, "view_tokens") / max(w.x[0], 1e-12), _at(a, p, "view_tokens") / max(w.x[1], 1e-12)
        text += f"; {sb:.0%} -> {sa:.0%} of its tokens in {p}"
    if not w.view.payer and len(w.flows):  # whose tokens changed the most
        flows = w.flows if w.view.value is None else w.flows[w.flows["pool"] == w.view.value]
        per_tenant = flows.groupby("tenant")[["tokens_before", "tokens_after"]].sum()
        change = (per_tenant["tokens_after"] - per_tenant["tokens_before"]).sort_values(key=abs, ascending=False)
        top = [
            f"{t} {_pct(to_float(per_tenant.at[t, 'tokens_before']), to_float(per_tenant.at[t, 'tokens_after']))}"
            for t in change.index[:2]
        ]
        if top:
            text += "; tenants' tokens per hour: " + ", ".join(top)
    return text


def sentence(ex: CostExplanation, w: Words) -> str:
    assert ex.break_at is not None
    change = ex.after - ex.before
    verb = "rose" if change >= 0 else "fell"
    head = (
        f"Cost per 1M tokens of {ex.view} {verb} from ${ex.before:,.4g} to ${ex.after:,.4g} at "
        f"{ex.break_at:%H:%M:%S} UTC (±{ex.step}s; {_money(change)}, {_pct(ex.before, ex.after)})"
    )
    along = ex.evidence[ex.evidence["share"] > 0.05].head(3)
    if along.empty:
        return head + "; no single driver explains it (see the decomposition)" + _scaling_clause(w) + "."
    against = ex.evidence[ex.evidence["share"] < 0]
    offset = len(against) and to_float(along["share"].max()) > 1.0
    parts = []
    for r in records(along):
        label = _label(str(r["kind"]), str(r["pool"]), w)
        share = "" if offset else f", {to_float(r['share']):.0%} of the change"
        parts.append(f"{label} ({_money(to_float(r['usd_per_million']))}{share})")
    text = f"{head}. Consistent with {'; '.join(parts)}"
    if offset:
        r = records(against.sort_values("share").head(1))[0]
        text += (
            f"; partly offset by {_label(str(r['kind']), str(r['pool']), w)} ({_money(to_float(r['usd_per_million']))})"
        )
    if len(ex.movers):
        m = ex.movers.iloc[0]
        text += (
            f"; tenant {m.tenant}'s requests moved to {m.to_pool} ({m.share_before:.0%} -> {m.share_after:.0%} of its "
            f"tokens)" + (f", routed by {m.route}: {m.example}" if m.example else "")
        )
    return text + _scaling_clause(w) + "."


def _scaling_clause(w: Words) -> str:
    """ "; tiny-large scaled out 1 -> 2 replicas (+1) at 06:33 (...)" for each pool the view pays for
    (its part of the spend above zero on either side): replicas added are named whatever the spend
    part's rank, even under the sentence's 5 % cut."""
    pools = sorted(set(w.before.index) | set(w.after.index))
    paid = [p for p in pools if _at(w.before, p, "view_spend") > 0 or _at(w.after, p, "view_spend") > 0]
    return "".join(f"; {said}" for said in (scaled(w.scaling, p) for p in paid) if said)


def scaling_note(scaling: pd.DataFrame) -> str:
    """Where no break was found: the window's scale events all the same (the spend per hour moved
    even where the cost per token did not), and how to compare both sides of one."""
    said = [s for s in (scaled(scaling, str(p)) for p in sorted(set(scaling["pool"]))) if s] if len(scaling) else []
    if not said:
        return ""
    first = pd.Timestamp(scaling["decided_at"].min())
    return f" Meanwhile {'; '.join(said)}: `--at {first:%Y-%m-%dT%H:%M}` compares both sides of it."
