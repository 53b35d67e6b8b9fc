"""alembic environment for the metadata DB (SQLite or PostgreSQL).

The URL comes from, in order: a connection handed over by ``migrations.metadata_runner``
(``config.attributes["connection"]``), ``sqlalchemy.url`` set on the config, ``-x url=...``
on the alembic command line, and finally the ``metadata`` section of fleetscope's configuration
(fleetscope.yaml / FLEETSCOPE_METADATA_URL, read by ``common.config``) when alembic is run by hand.
"""

from __future__ import annotations

from logging.config import fileConfig

from alembic import context
from sqlalchemy import Connection

from common.config import Section, load_config
from storage.config import MetadataSettings
from storage.metadata import Base, make_engine

config = context.config
if config.config_file_name is not None and config.attributes.get("configure_logger", True):
    fileConfig(config.config_file_name, disable_existing_loggers=False)

target_metadata = Base.metadata


class _MetadataOnly(Section):
    """The one section alembic needs, read from fleetscope.yaml and FLEETSCOPE_METADATA_URL."""

    metadata: MetadataSettings = MetadataSettings()


def _url() -> str:
    url = config.get_main_option("sqlalchemy.url") or context.get_x_argument(as_dictionary=True).get("url")
    if url:
        return url
    return load_config(_MetadataOnly, strict=False).metadata.url  # alembic run by hand: fleetscope.yaml


def _configure(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        render_as_batch=connection.dialect.name == "sqlite",  # ALTER on SQLite
        compare_type=True,
    )
    with context.begin_transaction():
        context.run_migrations()


def run_offline() -> None:
    context.configure(url=_url(), target_metadata=target_metadata, literal_binds=True)
    with context.begin_transaction():
        context.run_migrations()


def run_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        _configure(connection)
        return
    engine = make_engine(_url())
    try:
        with engine.connect() as conn:
            _configure(conn)
            conn.commit()
    finally:
        engine.dispose()


if context.is_offline_mode():
    run_offline()
else:
    run_online()
