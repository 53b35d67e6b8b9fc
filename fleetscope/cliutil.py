"""Shared pieces of the command line: the --config option, error exit, settings loading.

In:  the ``--config`` path, a message to fail with, settings.
Out: ``Settings`` (or a one-line error and exit 2), the metadata DB's sessions after its migrations
     (or the store's error and exit 1).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NoReturn

import typer

from fleetscope.settings import Settings, SettingsError, load_settings

if TYPE_CHECKING:
    from sqlalchemy.orm import sessionmaker

__all__ = ["ConfigOption", "fail", "sessions_or_exit", "settings_or_exit"]

ConfigOption = Annotated[
    Path | None,
    typer.Option(
        "--config",
        "-c",
        help="Config file (default: $FLEETSCOPE_CONFIG or ./fleetscope.yaml).",
        show_default=False,
    ),
]


def fail(message: str, code: int = 1) -> NoReturn:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code)


def settings_or_exit(config: Path | None) -> Settings:
    try:
        return load_settings(config)
    except SettingsError as exc:
        fail(str(exc), code=2)


def sessions_or_exit(settings: Settings) -> sessionmaker[Any]:
    """The metadata DB migrated and its sessions; a store that cannot be reached: its line, exit 1."""
    from fleetscope.stores import migrate_all
    from storage.errors import StoreError
    from storage.metadata import make_engine, make_sessionmaker

    try:
        migrate_all(settings, clickhouse=False)
    except StoreError as exc:
        fail(str(exc))
    return make_sessionmaker(make_engine(settings.metadata.url))
