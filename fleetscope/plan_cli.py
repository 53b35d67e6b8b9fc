"""``fleetscope plan``: what if the fleet had been another one — a window of its own traffic
replayed against other replica counts, GPU types, KV budgets, routing policies, router thresholds
or in-flight limits, with latency, cache hits and cost, side by side with what it did.

In:  a window (``--since`` back from now, or ``--start``/``--end``), the variants (``--replicas
     tiny-small=1..4`` sweeps, ``--policy least_loaded,affinity``, ``--gpu tiny-small=L4``,
     ``--kv-tokens tiny-small=4096``, ``--scale 1.5``, ``--long-prompt-tokens``,
     ``--max-in-flight``, autoscaling policies ``--autoscale tiny-large=max:3,out.kv_cache_usage:0.7``),
     settings (the stores; GPU prices and SLO targets from the metadata DB; the fleet spec's model
     router, prefix length and autoscaling policies, or ``--spec``'s).
Out: on stdout the fit of the simulator to the recorded fleet, the backtest (the recorded
     fleet replayed against what it did), why the prefix cache missed, and a table of every
     fleet; where a pool autoscaled or a policy was asked for, the policies side by side (spend
     per hour, p99 TTFT, SLO attainment, most replicas, cold starts); the cheapest that meets
     the SLOs. ``--format json`` for scripts. Exit codes: 0 a plan, 1 the store cannot be read,
     2 bad options or nothing to plan on (one line).
"""

from __future__ import annotations

import json
import math
import re
from typing import TYPE_CHECKING, Annotated, Any

import typer

from fleetscope.cliutil import ConfigOption, fail, settings_or_exit
from fleetscope.explain_cli import _plain, window

if TYPE_CHECKING:
    from planner.plan import Changes

EXAMPLES = """Examples:
  fleetscope plan                                          # the last 30 minutes, replayed as they ran
  fleetscope plan --replicas tiny-small=1..4 --policy least_loaded,affinity
  fleetscope plan --gpu tiny-large=L4 --gpu-speed L4=0.15 --scale 2
  fleetscope plan --start 2026-12-03T20:00 --end 2026-12-03T20:30 --format json
  fleetscope plan --spec fleet-autoscale.yaml \
                  --autoscale tiny-large=out.requests_waiting:0.2,out_for:5 --autoscale tiny-large=max:2
  fleetscope plan --start 2026-12-03T20:10 --end 2026-12-03T20:20 \
                  --fit-start 2026-12-03T19:50 --fit-end 2026-12-03T20:10   # judged by a fit on the time before"""


def _pairs(values: list[str] | None, option: str) -> dict[str, str]:
    out = {}
    for value in values or []:
        name, sep, rest = value.partition("=")
        if not sep or not name or not rest:
            fail(f"{option} {value!r}: write NAME=VALUE, e.g. {option} tiny-small=2", code=2)
        out[name] = rest
    return out


def replica_counts(text: str, option: str) -> list[int]:
    """``2``, ``1..4`` or a list of them (``2,4,6``, ``1..3,6``) -> the counts, sorted, once each."""
    out: set[int] = set()
    for part in text.split(","):
        found = re.fullmatch(r"(\d+)(?:\.\.(\d+))?", part.strip())
        if not found:
            fail(f"{option}: {text!r} is not a count, a range like 1..4 or a list like 2,4", code=2)
        low, high = int(found[1]), int(found[2] or found[1])
        if high < low:
            fail(f"{option}: the range {part.strip()!r} runs backwards", code=2)
        out.update(range(low, high + 1))
    return sorted(out)


def _number(text: str, option: str) -> float:
    try:
        return float(text)
    except ValueError:
        fail(f"{option}: {text!r} is not a number", code=2)


_ReplicasOption = Annotated[
    list[str] | None, typer.Option(help="MODEL=N, MODEL=A..B or MODEL=2,4,6 (swept); repeat for several models.")
]
_PolicyOption = Annotated[
    str | None,
    typer.Option(help="Routing policies to sweep: least_loaded, round_robin, affinity (comma-separated)."),
]
_GpuSpeedOption = Annotated[
    list[str] | None, typer.Option(help="TYPE=SPEED: a GPU type's speed relative to the others (H100 = 1).")
]
_ScaleOption = Annotated[
    str | None, typer.Option(help="Traffic scale factors to sweep (comma-separated, e.g. 1,1.5,2).")
]
_LongPromptOption = Annotated[
    int | None, typer.Option(min=1, help="The model router's long-prompt threshold (tokens).")
]
_SharedCoresOption = Annotated[
    float | None,
    typer.Option(
        min=0.1,
        help="The recorded engines shared this many CPU cores (the CPU demo fleet `fleetscope up` runs: "
        "this machine's cores); a variant's replicas bring their share each. Default: each replica its own GPU.",
    ),
]
_PrefixTokensOption = Annotated[
    int | None,
    typer.Option(
        min=1,
        help="How long a shared prefix is, in tokens, where the log does not say (default: the tokens the "
        "gateway hashes, its affinity_prefix_tokens).",
    ),
]
_AutoscaleOption = Annotated[
    list[str] | None,
    typer.Option(
        help="POOL=KEY:VALUE,... an autoscaling policy to replay (repeat for several; each is one fleet), starting "
        "from the pool's recorded policy (the fleet spec's) or the defaults: min:N, max:N, out.SIGNAL:X, in.SIGNAL:X "
        "(X or off; signals kv_cache_usage, requests_waiting, requests_running, ttft_p99_over_slo), out_for:S, "
        "in_for:S, cooldown:S (after a scale-out), in_cooldown:S, cold_start:S (default: the recorded median), "
        "drain_timeout:S, flap_window:S, max_reversals:N. Spend counts a replica from ready to removed."
    ),
]
_SpecOption = Annotated[
    str | None,
    typer.Option(
        help="The fleet spec the recorded run used (its model router, prefix length, autoscaling policies and "
        "SLOs); default: settings' fleet.spec."
    ),
]
_FitStartOption = Annotated[
    str | None,
    typer.Option(
        help="Fit on another window (ISO time, UTC; with --fit-end), e.g. the quiet hour before an incident: "
        "the backtest then judges the fit out of sample. Default: the window's first 10 minutes."
    ),
]


def plan_command(
    since: Annotated[str, typer.Option(help="The window: this far back from --end (e.g. 30m, 2h).")] = "30m",
    start: Annotated[str | None, typer.Option(help="The window's start (ISO time, UTC); instead of --since.")] = None,
    end: Annotated[str | None, typer.Option(help="The window's end (ISO time, UTC; default now).")] = None,
    replicas: _ReplicasOption = None,
    policy: _PolicyOption = None,
    gpu: Annotated[list[str] | None, typer.Option(help="MODEL=GPU_TYPE: the pool on another GPU type.")] = None,
    gpu_speed: _GpuSpeedOption = None,
    kv_tokens: Annotated[list[str] | None, typer.Option(help="MODEL=TOKENS: each replica's KV cache.")] = None,
    scale: _ScaleOption = None,
    long_prompt_tokens: _LongPromptOption = None,
    max_in_flight: Annotated[int | None, typer.Option(min=1, help="The gateway's requests in flight at most.")] = None,
    shared_cores: _SharedCoresOption = None,
    prefix_tokens: _PrefixTokensOption = None,
    autoscale: _AutoscaleOption = None,
    spec: _SpecOption = None,
    fit: Annotated[bool, typer.Option(help="Fit the simulator's cost to the recorded fleet first.")] = True,
    fit_start: _FitStartOption = None,
    fit_end: Annotated[str | None, typer.Option(help="The fitting window's end (ISO time, UTC).")] = None,
    fmt: Annotated[str, typer.Option("--format", help="text or json.")] = "text",
    config: ConfigOption = None,
) -> None:
    """Replay a window of the fleet's recorded traffic (arrivals, lengths, prefixes, tenants; the
    sampling weights expanded) through the gateway's routing and the engine simulator, fitted to the
    recorded fleet, against the variants asked for: p50/p99 TTFT and ITL, SLO attainment and goodput,
    prefix hit rate, KV saturation, rejections, spend and $/1M tokens beside what the fleet did, and
    the cheapest variant that meets the SLOs; autoscaling policies (the recorded one, any --autoscale) compared."""
    from fleetscope.stores import migrate_all, open_clickhouse
    from planner.fleet import PlanError, gateway_routing
    from planner.plan import plan
    from planner.policies import comparison
    from storage.catalog import gpu_prices, slo_targets
    from storage.errors import StoreError
    from storage.metadata import make_engine, make_sessionmaker

    if fmt not in ("text", "json"):
        fail(f"--format must be text or json, not {fmt!r}", code=2)
    changes = _changes(replicas, policy, gpu, kv_tokens, scale, long_prompt_tokens, max_in_flight)
    speeds = {t: _number(v, "--gpu-speed") for t, v in _pairs(gpu_speed, "--gpu-speed").items()}
    fit_on = _fit_window(fit_start, fit_end, fit)
    settings = settings_or_exit(config)
    begin, stop = window(since, start, end)
    spec_path = spec or settings.fleet.spec
    router, prefix_length = gateway_routing(spec_path)
    scaling = _autoscale(spec_path, autoscale)
    if prefix_tokens is not None:
        prefix_length = prefix_tokens
    try:
        migrate_all(settings)  # a fresh store: its tables (and the seeded GPU prices), then "nothing recorded"
        client = open_clickhouse(settings)
    except StoreError as exc:
        fail(str(exc))
    sessions = make_sessionmaker(make_engine(settings.metadata.url))
    try:
        planned = plan(
            client,
            begin,
            stop,
            prices=gpu_prices(sessions),
            targets=slo_targets(sessions),
            changes=changes,
            router=router,
            prefix_tokens=prefix_length,
            speeds=speeds,
            fitted=fit,
            shared_cores=shared_cores,
            fit_on=fit_on,
            autoscale=scaling,
        )
        misses = _misses(client, begin, stop, prefix_length)
    except PlanError as exc:
        fail(str(exc), code=2)
    finally:
        client.close()
    compared = comparison(planned, scaling)
    if fmt == "json":
        typer.echo(json.dumps(_as_json(planned, misses) | {"autoscaling": _records(compared)}, indent=2))
        return
    _print(planned, misses)
    _print_policies(compared)


def _fit_window(fit_start: str | None, fit_end: str | None, fit: bool) -> Any:
    """The window to fit the simulator on (None: the replayed window's first minutes); bad options: exit 2."""
    if (fit_start is None) != (fit_end is None):
        fail("--fit-start and --fit-end go together: the window to fit the simulator on", code=2)
    fit_on = window("0s", fit_start, fit_end) if fit_start and fit_end else None
    if fit_on is not None and not fit:
        fail("--fit-start/--fit-end fit the simulator; --no-fit replays it unfitted: pick one", code=2)
    return fit_on


def _autoscale(spec_path: Any, texts: list[str] | None) -> Any:
    """The fleet spec's autoscaling (the recorded policies) and the ``--autoscale`` ones; a bad one: exit 2."""
    from planner.fleet import PlanError
    from planner.policies import parse, spec_policies

    try:
        return spec_policies(spec_path, [parse(text) for text in texts or []])
    except PlanError as exc:
        fail(str(exc), code=2)


def _changes(
    replicas: list[str] | None,
    policy: str | None,
    gpu: list[str] | None,
    kv_tokens: list[str] | None,
    scale: str | None,
    long_prompt_tokens: int | None,
    max_in_flight: int | None,
) -> Changes:
    """The variants asked for on the command line; a bad one: its line and exit 2."""
    from planner.plan import Changes

    changes = Changes(
        replicas={m: replica_counts(v, "--replicas") for m, v in _pairs(replicas, "--replicas").items()},
        policies=[p.strip() for p in policy.split(",") if p.strip()] if policy else [],
        gpu=_pairs(gpu, "--gpu"),
        kv_tokens={m: int(_number(v, "--kv-tokens")) for m, v in _pairs(kv_tokens, "--kv-tokens").items()},
        scales=[_number(s, "--scale") for s in scale.split(",")] if scale else [],
        long_prompt_tokens=long_prompt_tokens,
        max_in_flight=max_in_flight,
    )
    if any(s <= 0 for s in changes.scales):
        fail("--scale: a traffic scale must be above 0", code=2)
    return changes


def _misses(client: Any, begin: Any, stop: Any, prefix_tokens: int) -> dict[str, float]:
    from analytics.prefix import prefix_misses

    found = prefix_misses(client, begin, stop, prefix_tokens=prefix_tokens)
    return {k: found.attrs.get(k, math.nan) for k in ("hit_rate", "affinity_hit_rate", "observed_hit_rate")} | {
        f"misses_{k}": v for k, v in (found.attrs.get("misses") or {}).items()
    }


def _pct(x: float) -> str:
    return "–" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.0%}"


def _signed(x: float, spec: str) -> str:
    return "–" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, "+" + spec)


def _s(x: float) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "–"
    return f"{x * 1000:.0f}ms" if x < 1 else f"{x:.2f}s"


def _points(x: float) -> str:
    return "–" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.0f} points"


def _print(planned: Any, misses: dict[str, float]) -> None:
    start, end = planned.window
    typer.echo(f"window {start:%Y-%m-%d %H:%M} – {end:%H:%M} UTC; replay {planned.requests_per_s:,.0f} requests/s")
    if planned.fit is not None:
        typer.echo(f"fit: {planned.fit.describe()}")
    typer.echo("backtest (the recorded fleet replayed, against what it did):")
    for row in planned.backtest.to_dict("records"):
        typer.echo(
            f"  {row['model']:<12} p99 TTFT {_s(row['p99_ttft_observed'])} observed, {_s(row['p99_ttft_replayed'])} "
            f"replayed ({_signed(row['p99_ttft_error'], '.0%')}); mean KV {_pct(row['kv_mean_observed'])} / "
            f"{_pct(row['kv_mean_replayed'])} ({_signed(row['kv_mean_error_points'], '.1f')} points); p50 TTFT "
            f"{_s(row['p50_ttft_observed'])} / {_s(row['p50_ttft_replayed'])}; p99 ITL {_s(row['p99_itl_observed'])} / "
            f"{_s(row['p99_itl_replayed'])}"
            + ("" if row["within"] else f"  — outside 25 % / {_points(row['kv_tolerance_points'])}")
        )
    missed = sum(v for k, v in misses.items() if k.startswith("misses_") and not math.isnan(v))
    if missed > 0:
        parts = ", ".join(
            f"{misses[f'misses_{k}'] / missed:.0%} {w}"
            for k, w in (
                ("routing", "routing misses (warm on another replica)"),
                ("evicted", "evicted"),
                ("new_prefix", "new prefixes"),
            )
        )
        typer.echo(
            f"prefix cache: modelled hit rate {_pct(misses['hit_rate'])} "
            f"(engines {_pct(misses['observed_hit_rate'])}); of the prefix misses {parts}; "
            f"affinity routing would hit {_pct(misses['affinity_hit_rate'])}"
        )
    typer.echo(
        f"  {'fleet':<34} {'p50 TTFT':>9} {'p99 TTFT':>9} {'p99 ITL':>8} {'SLO':>6} {'goodput':>8} {'hits':>5} "
        f"{'KV':>5} {'KV≥90%':>7} {'rejected':>8} {'$/h':>8} {'$/1M tok':>9}"
    )
    for row in planned.table.to_dict("records"):
        typer.echo(
            f"  {row['fleet'][:34]:<34} {_s(row['p50_ttft']):>9} {_s(row['p99_ttft']):>9} {_s(row['p99_itl']):>8} "
            f"{_pct(row['slo_attainment']):>6} {row['goodput']:>7.2f}/s {_pct(row['hit_rate']):>5} "
            f"{_pct(row['kv_mean']):>5} {_pct(row['kv_saturated']):>7} {row['rejected']:>8,.0f} "
            f"{row['spend_per_hour']:>8.2f} {row['cost_per_million_tokens']:>9.3f}"
        )
    typer.echo(planned.cheapest_note)


def _print_policies(compared: Any) -> None:
    """The autoscaling policies side by side, one row per fleet and autoscaled pool."""
    if compared.empty:
        return
    typer.echo("autoscaling (spend from each replica's ready to its removal; a cold start is not billed):")
    typer.echo(
        f"  {'fleet':<44} {'pool':<12} {'$/h':>7} {'p99 TTFT':>9} {'SLO':>5} {'most':>5} {'cold':>5} "
        f"{'fleet $/h':>9}  policy"
    )
    for row in compared.to_dict("records"):
        typer.echo(
            f"  {row['fleet'][:44]:<44} {row['pool'][:12]:<12} {row['spend_per_hour']:>7.2f} {_s(row['p99_ttft']):>9} "
            f"{_pct(row['slo_attainment']):>5} {row['max_replicas']:>5} {row['cold_starts']:>5} "
            f"{row['fleet_spend_per_hour']:>9.2f}  {row['policy']}"
        )


def _records(frame: Any) -> list[dict[str, Any]]:
    return [{k: _plain(v) for k, v in r.items()} for r in frame.to_dict("records")]


def _as_json(planned: Any, misses: dict[str, float]) -> dict[str, Any]:
    start, end = planned.window
    return {
        "start": _plain(start),
        "end": _plain(end),
        "requests_per_s": _plain(planned.requests_per_s),
        "fit": None
        if planned.fit is None
        else {
            "step_factor": planned.fit.step_factor,
            "prefill_factor": planned.fit.prefill_factor,
            "error": planned.fit.error if math.isfinite(planned.fit.error) else None,
        },
        "backtest": [{k: _plain(v) for k, v in r.items()} for r in planned.backtest.to_dict("records")],
        "fleets": [{k: _plain(v) for k, v in r.items()} for r in planned.table.to_dict("records")],
        "cheapest": planned.cheapest,
        "cheapest_note": planned.cheapest_note,
        "prefix_cache": {k: _plain(v) for k, v in misses.items()},
    }
