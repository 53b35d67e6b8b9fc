"""``python -m fleetscope.dashboard_main run dashboard/app.py [streamlit options]``: the dashboard's
server process (``fleetscope dashboard`` starts it).

In:  Streamlit's command line; ``fleetscope.yaml`` / ``FLEETSCOPE_*`` (read when a page first
     needs them, in the server).
Out: the Streamlit server with the dashboard's configuration provider registered
     (``dashboard.context.provide``: the settings, and the ClickHouse client, the readers a page
     reads its answers on at once, and the metadata sessions opened from them), then
     ``dashboard.launch``: the pages' imports done before the first viewer, and Streamlit.
"""

from __future__ import annotations

from typing import Any

from dashboard import context, launch
from fleetscope.settings import Settings, SettingsError, load_settings
from fleetscope.stores import open_clickhouse
from storage.metadata import make_engine, make_sessionmaker

__all__ = ["main", "provider"]


def _settings() -> Settings:
    try:
        return load_settings()
    except SettingsError as exc:  # the pages catch ValueError: one line, shown in the server's log
        raise ValueError(str(exc)) from None


def _stores(settings: Settings) -> tuple[Any, Any]:
    return open_clickhouse(settings), make_sessionmaker(make_engine(settings.metadata.url))


def provider() -> context.Provider:
    return context.Provider(settings=_settings, stores=_stores, reader=open_clickhouse)


def main() -> None:
    context.provide(provider())
    launch.main()


if __name__ == "__main__":
    main()
