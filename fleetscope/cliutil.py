"""Shared pieces of the command line: the --config option, error exit, settings loading."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, NoReturn

import typer

from fleetscope.settings import Settings, SettingsError, load_settings

__all__ = ["ConfigOption", "fail", "settings_or_exit"]

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
