"""Storage: how fleetscope reaches its two stores.

- ``storage.clickhouse``: telemetry warehouse (chDB embedded or a ClickHouse server),
  one clickhouse-connect client API for both.
- ``storage.metadata``: relational metadata DB (SQLite or PostgreSQL) through SQLAlchemy 2:
  prices, replicas, SLOs, annotations (later: rules, alert state, outbox, saved queries).
- ``storage.errors``: the error types both raise.

Imports nothing else of fleetscope.
"""
