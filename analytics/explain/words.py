"""``explain``'s one sentence, phrased as "consistent with", from the ranked evidence and strata.

In:  an ``Explanation`` with its evidence and onset, the latency and quantile, the strata by
     prompt length and the long-prompt cut.
Out: the sentence.
"""

from __future__ import annotations

import pandas as pd

from analytics.explain.model import Explanation

__all__ = ["sentence"]


def sentence(ex: Explanation, latency: str, q: float, strata: pd.DataFrame, long_tokens: float) -> str:
    head = (f"p{q * 100:g} {latency.upper()} rose from {ex.before:.2f}s to {ex.after:.2f}s at "
            f"{ex.break_at:%H:%M:%S} UTC (±{ex.step}s)")
    if ex.onset is not None and ex.onset < ex.break_at:
        first = ex.evidence[ex.evidence["moved_at"] == pd.Timestamp(ex.onset)].iloc[0]["signal"]
        head += f"; it began at {ex.onset:%H:%M:%S}, when the {first} moved"
    top = ex.evidence[ex.evidence["score"] > 0.05].head(3)
    if top.empty:
        return head + "; none of the signals fleetscope watches moved with it (look at deploys and annotations)."
    causes = [f"{r.signal} ({r.before} -> {r.after})" for r in top.itertuples()]
    short = strata.set_index("band").loc["short"] if "short" in set(strata["band"]) else None
    long = strata.set_index("band").loc["long"] if "long" in set(strata["band"]) else None
    verdict = ""
    if short is not None and pd.notna(short["slowdown"]):
        heavier = long is not None and pd.notna(long["share_after"]) and long["share_after"] - long["share_before"] >= 0.05
        if short["slowdown"] >= 1.5:
            verdict = (f"; short prompts slowed too (p{q * 100:g} {short['q_before']:.2f}s -> {short['q_after']:.2f}s): "
                       "everyone got slower, contention" + (" brought on by a heavier mix" if heavier else ""))
        elif heavier:
            verdict = (f"; short prompts kept their latency ({short['q_before']:.2f}s -> {short['q_after']:.2f}s): "
                       f"the mix got heavier (prompts over {long_tokens:,.0f} tokens {long['share_before']:.0%} -> "
                       f"{long['share_after']:.0%})")
    return f"{head}. Consistent with {', '.join(causes)}{verdict}."
