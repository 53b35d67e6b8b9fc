"""ClickHouse schema migrations: ordered ``.sql`` files -> applied DDL, each exactly once.

In:  a clickhouse-connect ``Client``, the directory ``migrations/clickhouse/`` of files named
     ``NNNN_description.sql``, and an optional cluster name.
Out: the migrations applied by this call, recorded in table ``fleetscope_migrations``
     (version, name, sha256 checksum, applied_at).

Rules:
- Files apply in version order; a version already recorded is skipped.
- An applied file whose checksum changed is an error (``ChecksumMismatch``): add a new
  migration instead of editing an applied one. A recorded version with no file is an error
  too (the store was migrated by a newer fleetscope).
- Statements are separated by a ``;`` at the end of a line. DDL is written idempotent
  (``IF NOT EXISTS``), so a migration interrupted half-way is simply re-run.

Templates, so one file serves a single node and a cluster (DESIGN.md section 6):
    {{on_cluster}}                 ""  | ON CLUSTER 'name'
    {{engine:MergeTree}}           MergeTree | ReplicatedMergeTree('/clickhouse/tables/{shard}/{database}/{table}',
    '{replica}')
                                   (any *MergeTree, with arguments: {{engine:ReplacingMergeTree(v)}})
    {{local:samples}}              samples | samples_local      (the physical per-shard table)
    {{distributed:samples:KEY}}    nothing | CREATE TABLE samples ... ENGINE = Distributed(..., KEY)
Readers always query the plain name, which is the table itself on one node and the
``Distributed`` table on a cluster.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from clickhouse_connect.driver.client import Client
from clickhouse_connect.driver.exceptions import ClickHouseError

from storage.errors import ChecksumMismatch, MigrationError

__all__ = [
    "MIGRATIONS_DIR",
    "MIGRATIONS_TABLE",
    "Migration",
    "apply",
    "applied",
    "discover",
    "pending",
    "render",
]

MIGRATIONS_DIR = Path(__file__).resolve().parent / "clickhouse"
MIGRATIONS_TABLE = "fleetscope_migrations"

_FILE_NAME = re.compile(r"^(\d{4})_([a-z0-9_]+)\.sql$")
_TEMPLATE = re.compile(r"\{\{\s*(\w+)(?::(.*?))?\s*\}\}")
_STATEMENT_END = re.compile(r";[ \t]*(?:--[^\n]*)?$", re.MULTILINE)
_MERGE_TREE = re.compile(r"^(\w*MergeTree)(?:\((.*)\))?$", re.DOTALL)
_REPLICA_PATH = "'/clickhouse/tables/{shard}/{database}/{table}', '{replica}'"


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    path: Path
    sql: str

    @property
    def checksum(self) -> str:
        return hashlib.sha256(self.sql.encode("utf-8")).hexdigest()

    @property
    def filename(self) -> str:
        return self.path.name


def discover(directory: Path = MIGRATIONS_DIR) -> list[Migration]:
    """The migration files in ``directory``, in version order."""
    found: dict[int, Migration] = {}
    for path in sorted(directory.glob("*.sql")):
        match = _FILE_NAME.match(path.name)
        if not match:
            raise MigrationError(f"{path}: migration files are named NNNN_description.sql (lower case, digits, _)")
        version = int(match.group(1))
        if version in found:
            raise MigrationError(
                f"two migrations have version {version:04d}: {found[version].filename} and {path.name}"
            )
        found[version] = Migration(version, match.group(2), path, path.read_text(encoding="utf-8"))
    return [found[v] for v in sorted(found)]


def _split(sql: str) -> list[str]:
    statements = []
    for chunk in _STATEMENT_END.split(sql):
        body = "\n".join(
            line for line in chunk.splitlines() if line.strip() and not line.strip().startswith("--")
        ).strip()
        if body:
            statements.append(body)
    return statements


def _engine(spec: str, cluster: str | None) -> str:
    match = _MERGE_TREE.match(spec.strip())
    if not match:
        raise MigrationError(f"{{{{engine:{spec}}}}}: expected a *MergeTree engine")
    name, args = match.group(1), match.group(2)
    if cluster is None:
        return spec.strip()
    inner = _REPLICA_PATH + (f", {args}" if args else "")
    return f"Replicated{name}({inner})"


def render(sql: str, cluster: str | None = None) -> list[str]:
    """Expand the templates for a single node (``cluster=None``) or a cluster; split."""

    def expand(match: re.Match[str]) -> str:
        key, arg = match.group(1), (match.group(2) or "").strip()
        if key == "on_cluster":
            return f"ON CLUSTER '{cluster}'" if cluster else ""
        if key == "engine":
            return _engine(arg, cluster)
        if key == "local":
            return f"{arg}_local" if cluster else arg
        if key == "distributed":
            table, _, sharding_key = arg.partition(":")
            if not table or not sharding_key:
                raise MigrationError(f"{{{{distributed:{arg}}}}}: expected TABLE:SHARDING_KEY")
            if not cluster:
                return ""
            return (
                f"CREATE TABLE IF NOT EXISTS {table} ON CLUSTER '{cluster}' AS {table}_local "
                f"ENGINE = Distributed('{cluster}', currentDatabase(), '{table}_local', {sharding_key})"
            )
        raise MigrationError(f"unknown template {{{{{key}}}}} in migration SQL")

    return [s for s in (_TEMPLATE.sub(expand, stmt).strip() for stmt in _split(sql)) if s]


def _ensure_table(client: Client, cluster: str | None) -> None:
    (ddl,) = render(
        f"""CREATE TABLE IF NOT EXISTS {MIGRATIONS_TABLE} {{{{on_cluster}}}} (
            version UInt32,
            name String,
            checksum String,
            applied_at DateTime64(3, 'UTC')
        ) ENGINE = {{{{engine:MergeTree}}}} ORDER BY version""",
        cluster,
    )
    client.command(ddl)


def applied(client: Client, cluster: str | None = None) -> dict[int, tuple[str, str]]:
    """version -> (name, checksum) of the migrations recorded in the store."""
    _ensure_table(client, cluster)
    rows = client.query(
        f"SELECT version, any(name), any(checksum) FROM {MIGRATIONS_TABLE} GROUP BY version"
    ).result_rows
    return {int(v): (str(n), str(c)) for v, n, c in rows}


def pending(client: Client, cluster: str | None = None, directory: Path = MIGRATIONS_DIR) -> list[Migration]:
    """Migrations not yet applied, after checking the applied ones are unchanged."""
    migrations = discover(directory)
    done = applied(client, cluster)
    by_version = {m.version: m for m in migrations}
    for version, (name, checksum) in sorted(done.items()):
        migration = by_version.get(version)
        if migration is None:
            raise MigrationError(
                f"the store has migration {version:04d}_{name}.sql applied, which this fleetscope "
                "does not have (was it migrated by a newer version?)"
            )
        if migration.checksum != checksum:
            raise ChecksumMismatch(
                f"migration {migration.filename} was changed after it was applied "
                f"(store {checksum[:12]}, file {migration.checksum[:12]}): restore the file "
                "and put the change in a new migration"
            )
    return [m for m in migrations if m.version not in done]


def apply(
    client: Client,
    cluster: str | None = None,
    directory: Path = MIGRATIONS_DIR,
    on_applied: Callable[[Migration], None] | None = None,
) -> list[Migration]:
    """Apply every pending migration in order; return the ones applied."""
    todo = pending(client, cluster, directory)
    for migration in todo:
        for number, statement in enumerate(render(migration.sql, cluster), start=1):
            try:
                client.command(statement)
            except ClickHouseError as exc:
                first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
                raise MigrationError(f"migration {migration.filename}, statement {number}: {first}") from exc
        client.insert(
            MIGRATIONS_TABLE,
            [[migration.version, migration.name, migration.checksum, datetime.now(UTC)]],
            column_names=["version", "name", "checksum", "applied_at"],
        )
        if on_applied is not None:
            on_applied(migration)
    return todo
