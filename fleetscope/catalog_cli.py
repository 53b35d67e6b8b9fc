"""``fleetscope prices ...`` and ``fleetscope slo ...``: the GPU prices and SLO targets that cost and
SLO analytics read, kept in the metadata DB.

In:  settings (``metadata.url``) and command-line arguments.
Out: tables on stdout; changes through ``storage.catalog`` (the metadata DB is migrated first,
     so a fresh install has the seeded prices). A bad value exits 2 with one line.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from fleetscope.cliutil import ConfigOption, fail, sessions_or_exit, settings_or_exit

if TYPE_CHECKING:
    from sqlalchemy.orm import sessionmaker

prices_app = typer.Typer(help="GPU prices per hour (cost analytics).", no_args_is_help=True)
slo_app = typer.Typer(help="Latency SLO targets per model (attainment, burn rates, goodput).", no_args_is_help=True)


def _sessions(config: Path | None) -> sessionmaker[Any]:
    return sessions_or_exit(settings_or_exit(config))


@prices_app.command("list")
def prices_list(config: ConfigOption = None) -> None:
    """Show the price of each GPU type (USD per GPU-hour)."""
    from storage.catalog import gpu_prices

    for gpu, price in sorted(gpu_prices(_sessions(config)).items()):
        typer.echo(f"{gpu:<16} {price:>8.4f}")


@prices_app.command("set")
def prices_set(
    gpu_type: Annotated[str, typer.Argument(help="GPU type, as the replicas' gpu_type label says (e.g. H100).")],
    usd_per_gpu_hour: Annotated[float, typer.Argument(help="USD per GPU-hour.")],
    note: Annotated[str | None, typer.Option(help="Where the price comes from (contract, list price).")] = None,
    config: ConfigOption = None,
) -> None:
    """Add or change the price of a GPU type. Example: fleetscope prices set H100 2.25 --note "1-year reserved\""""
    from storage.catalog import set_gpu_price

    try:
        set_gpu_price(_sessions(config), gpu_type, usd_per_gpu_hour, note)
    except ValueError as exc:
        fail(str(exc), code=2)
    typer.echo(f"{gpu_type}: ${usd_per_gpu_hour:g} per GPU-hour")


@slo_app.command("list")
def slo_list(config: ConfigOption = None) -> None:
    """Show the SLO targets."""
    from storage.catalog import slo_targets

    targets = slo_targets(_sessions(config))
    if not targets:
        typer.echo("no SLO targets (add one: fleetscope slo set MODEL ttft 2.0)")
    for t in targets:
        typer.echo(f"{t.label:<40} objective {t.objective:g} over {t.window_days} days")


@slo_app.command("set")
def slo_set(
    model: Annotated[str, typer.Argument(help="Served model name.")],
    metric: Annotated[str, typer.Argument(help="ttft, itl, tpot or e2e.")],
    threshold_seconds: Annotated[float, typer.Argument(help="A request meets the target at or under this latency.")],
    objective: Annotated[
        float, typer.Option(help="Share of requests that must meet it (0.99: p99 <= threshold).")
    ] = 0.99,
    window_days: Annotated[int, typer.Option(help="The SLO window (error budget).")] = 30,
    percentile: Annotated[
        float | None,
        typer.Option(
            help="Make it a percentile target: met when this percentile (e.g. 0.95) is at or under the threshold."
        ),
    ] = None,
    config: ConfigOption = None,
) -> None:
    """Add or change a model's target on one latency.

    A threshold target (default) is met when --objective of the requests are within the threshold; a percentile
    target (--percentile 0.95) when the observed p95 is. Burn rates and the error budget use the objective either way.

    Example: fleetscope slo set tiny-small ttft 1.0 --objective 0.99
    """
    from storage.catalog import SloTarget, set_slo

    target = SloTarget(model, metric, threshold_seconds, objective, window_days, percentile)
    try:
        set_slo(_sessions(config), target)
    except ValueError as exc:
        fail(str(exc), code=2)
    typer.echo(f"{target.label}, objective {objective:g} over {window_days} days")


@slo_app.command("delete")
def slo_delete(
    model: Annotated[str, typer.Argument(help="Served model name.")],
    metric: Annotated[str, typer.Argument(help="ttft, itl, tpot or e2e.")],
    config: ConfigOption = None,
) -> None:
    """Remove a model's target on one latency."""
    from storage.catalog import delete_slo

    if not delete_slo(_sessions(config), model, metric):
        fail(f"no SLO target for {model} {metric}", code=2)
    typer.echo(f"removed {model} {metric}")
