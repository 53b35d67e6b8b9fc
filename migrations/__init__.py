"""Schema migrations for both stores.

- ``migrations/clickhouse/NNNN_*.sql`` + ``migrations.clickhouse_runner``: versioned
  ClickHouse DDL, single node or cluster from the same files.
- ``migrations/metadata/`` (alembic environment and versions) + ``migrations.metadata_runner``:
  the relational metadata DB on SQLite or PostgreSQL.

Imports ``storage`` only.
"""
