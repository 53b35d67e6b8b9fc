"""Metadata DB migrations: apply alembic revisions and report what was applied.

In:  an SQLAlchemy URL (SQLite or PostgreSQL).
Out: the list of revisions applied by this call (empty when already at head), or a
     ``MigrationError`` / ``StoreUnavailable`` with a one-line reason.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy.exc import OperationalError, SQLAlchemyError

from storage.errors import MigrationError, StoreUnavailable
from storage.metadata import make_engine

__all__ = ["Revision", "alembic_config", "current", "pending", "upgrade", "downgrade"]

SCRIPT_LOCATION = Path(__file__).resolve().parent / "metadata"


@dataclass(frozen=True)
class Revision:
    revision: str
    description: str


def alembic_config(url: str) -> Config:
    """An alembic ``Config`` for ``url`` without an ini file (logging left to the caller)."""
    cfg = Config()
    cfg.set_main_option("script_location", str(SCRIPT_LOCATION))
    cfg.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    cfg.attributes["configure_logger"] = False
    return cfg


def _describe_url(url: str) -> str:
    from sqlalchemy.engine import make_url

    return make_url(url).render_as_string(hide_password=True)


def current(url: str) -> str | None:
    """The revision the database is at (None when empty)."""
    engine = make_engine(url)
    try:
        with engine.connect() as conn:
            return MigrationContext.configure(conn).get_current_revision()
    except OperationalError as exc:
        raise StoreUnavailable(f"cannot reach metadata DB {_describe_url(url)}: {_first_line(exc)}") from exc
    finally:
        engine.dispose()


def pending(url: str) -> list[Revision]:
    """Revisions between the database's current one and head, oldest first."""
    script = ScriptDirectory.from_config(alembic_config(url))
    at = current(url)
    known = {rev.revision for rev in script.walk_revisions()}
    if at is not None and at not in known:
        raise MigrationError(
            f"metadata DB {_describe_url(url)} is at revision {at!r}, which this fleetscope "
            "does not know (was it migrated by a newer version?)"
        )
    revs = list(script.iterate_revisions("heads", at or "base"))
    return [Revision(r.revision, r.doc or "") for r in reversed(revs)]


def upgrade(url: str, target: str = "head") -> list[Revision]:
    """Apply pending revisions; return those applied."""
    todo = pending(url)
    if not todo:
        return []
    engine = make_engine(url)
    cfg = alembic_config(url)
    try:
        with engine.begin() as conn:
            cfg.attributes["connection"] = conn
            command.upgrade(cfg, target)
    except SQLAlchemyError as exc:
        raise MigrationError(f"metadata migration failed on {_describe_url(url)}: {_first_line(exc)}") from exc
    finally:
        engine.dispose()
    return todo


def downgrade(url: str, target: str = "base") -> None:
    engine = make_engine(url)
    cfg = alembic_config(url)
    try:
        with engine.begin() as conn:
            cfg.attributes["connection"] = conn
            command.downgrade(cfg, target)
    finally:
        engine.dispose()


def _first_line(exc: BaseException) -> str:
    text = str(getattr(exc, "orig", None) or exc)
    return text.strip().splitlines()[0] if text.strip() else type(exc).__name__
