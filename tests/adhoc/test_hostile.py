"""Hostile ad-hoc SQL: every input below fails with a clear message, and the store is the same
afterwards (every table and its row count compared before and after, files untouched); the
slow one is stopped by the timeout. Run on the real chDB store through ``ReadOnlyRunner``."""

from __future__ import annotations

from pathlib import Path

import pytest

from adhoc.guard import Refused, check
from adhoc.runner import QueryFailed

OUTFILE = Path("/tmp/fleetscope-hostile-outfile.csv")

# (input, what the message must say)
HOSTILE = [
    ("INSERT INTO requests (model) VALUES ('x')", "INSERT, which changes the store"),
    ("INSERT INTO FUNCTION file('/tmp/fleetscope-x.csv', 'CSV') SELECT 1", "INSERT"),
    ("ALTER TABLE requests DELETE WHERE 1", "ALTER, which changes the store"),
    ("ALTER TABLE requests UPDATE model = 'x' WHERE 1", "ALTER"),
    ("DELETE FROM requests WHERE 1", "DELETE"),
    ("TRUNCATE TABLE samples", "TRUNCATE"),
    ("DROP TABLE samples", "DROP, which changes the store"),
    ("DROP DATABASE default", "DROP"),
    ("CREATE TABLE evil (x UInt8) ENGINE = Memory", "CREATE"),
    ("CREATE TABLE copy ENGINE = MergeTree ORDER BY tuple() AS SELECT * FROM requests", "CREATE"),
    ("RENAME TABLE requests TO gone", "RENAME"),
    ("OPTIMIZE TABLE samples FINAL", "OPTIMIZE"),
    ("DETACH TABLE samples", "DETACH"),
    ("SYSTEM SHUTDOWN", "SYSTEM SHUTDOWN controls the server"),
    ("SYSTEM DROP MARK CACHE", "SYSTEM"),
    ("KILL QUERY WHERE 1", "KILL"),
    ("GRANT ALL ON *.* TO default", "GRANT"),
    ("CREATE USER mallory IDENTIFIED BY 'x'", "CREATE USER"),
    ("SET readonly = 0", "SET"),
    ("USE system", "USE"),
    ("SELECT count() FROM requests SETTINGS readonly = 0", "SETTINGS clause is not allowed"),
    ("SELECT count() FROM requests SETTINGS max_execution_time = 0, max_result_rows = 0", "SETTINGS clause"),
    ("SELECT * FROM file('/etc/passwd', 'LineAsString')", "file() reaches files"),
    ("SELECT file('/etc/passwd')", "file() reaches files"),
    ("SELECT * FROM url('http://127.0.0.1:9/x', 'CSV', 'a String')", "url()"),
    ("SELECT * FROM s3('http://127.0.0.1:9/bucket/x.csv')", "s3()"),
    ("SELECT * FROM remote('127.0.0.1:9000', default.requests)", "remote()"),
    ("SELECT * FROM executable('cat /etc/passwd', 'TSV', 'x String')", "executable()"),
    ("SELECT * FROM postgresql('127.0.0.1:5432', 'test', 't', 'postgres', '')", "postgresql()"),
    ("SELECT * FROM mysql('127.0.0.1:3306', 'db', 't', 'root', '')", "mysql()"),
    ("SELECT * FROM numbers(10) INTO OUTFILE '/tmp/fleetscope-hostile-outfile.csv'", "INTO OUTFILE"),
    ("SELECT 1 FORMAT TSV", "FORMAT clause is not allowed"),
    ("SELECT 1; DROP TABLE samples", "one statement per query, got 2"),
    ("SELECT 1; SELECT 2", "one statement per query"),
    ("SELECT * FROM system.users", "system.users is not readable"),
    ("SELECT query FROM system.query_log", "system.query_log"),
    ("SELECT * FROM information_schema.tables t JOIN system.processes p ON 1", "only the fleetscope database"),
    ("SELECT getSetting('readonly')", "getsetting()"),
    ("", "the query is empty"),
    ("SELEKT * FROM requests", "cannot parse"),
    ("DESCRIBE file('/etc/passwd', 'TSVWithNames')", "not on a table function"),
    ("DESC url('http://169.254.169.254/latest/meta-data/', 'JSONEachRow')", "not on a table function"),
    ("SELECT 1 WHERE ('a', 'b') IN otherdb.secrets", "only the fleetscope database"),
    ("SELECT 'default' IN system.users", "system.users is not readable"),
    ("SELECT 1 IN merge('system', '^users$')", "IN merge(...) reads through a table function"),
    ("SELECT joinGet('otherdb.j', 'v', 1)", "joinget()"),
    ("SELECT dictGet('otherdb.d', 'a', toUInt64(1))", "dictget()"),
    ("SELECT getServerSetting('path')", "getserversetting()"),
    ("SELECT * FROM jdbc('jdbc:mysql://x/db', 't')", "jdbc()"),
    ("SELECT * FROM hdfs('hdfs://x/f', 'CSV', 'a String')", "hdfs()"),
    ("SELECT * FROM information_schema.tables", "only the fleetscope database"),
    ("SELECT name FROM system.tables", "system.tables is not readable"),
    ("SHOW DATABASES", "only SHOW TABLES"),
    ("SELECT 1 /* harmless */ ; /* and now */ DROP TABLE samples", "one statement per query"),
    ("SELECT * FROM FILE('/etc/passwd', 'LineAsString')", "file() reaches files"),
    ("WITH (SELECT 1) AS x SELECT * FROM (SELECT * FROM url('http://127.0.0.1:9/', 'CSV', 'a String'))", "url()"),
    ("SELECT * FROM requests AS r JOIN s3('http://127.0.0.1:9/b/k.csv') AS x ON 1", "s3()"),
    ("SELECT " + "(" * 3000 + "1" + ")" * 3000, "nested too deeply"),
]


@pytest.mark.parametrize("sql, says", HOSTILE, ids=[h[0][:40] or "empty" for h in HOSTILE])
def test_a_hostile_query_is_refused_clearly_and_changes_nothing(incident, sql: str, says: str) -> None:
    before = incident.snapshot()
    with pytest.raises(Refused) as err:
        incident.runner(timeout_s=5).run(sql)
    assert says in str(err.value), str(err.value)
    assert "\n" not in str(err.value)
    assert incident.snapshot() == before
    assert not OUTFILE.exists()


def test_there_are_at_least_thirty_and_they_cover_the_kinds_the_issue_names() -> None:
    assert len(HOSTILE) >= 30
    text = " ".join(h[0] for h in HOSTILE).upper()
    for needle in (
        "INSERT",
        "ALTER",
        "DROP",
        "CREATE",
        "SETTINGS READONLY = 0",
        "FILE(",
        "URL(",
        "S3(",
        "REMOTE(",
        "EXECUTABLE(",
        "POSTGRESQL(",
        "MYSQL(",
        "; ",
        "SYSTEM",
        "GRANT",
        "CREATE USER",
    ):
        assert needle in text, needle


def test_a_slow_query_is_stopped_by_the_timeout_and_a_huge_one_by_its_limits(incident) -> None:
    before = incident.snapshot()
    runner = incident.runner(timeout_s=2, max_rows=1000, max_memory_bytes=256 * 1024**2)
    with pytest.raises(QueryFailed, match="Timeout exceeded"):
        runner.run("SELECT count() FROM system.numbers WHERE sipHash64(number) = 42")
    with pytest.raises(QueryFailed, match="[Mm]emory limit"):
        runner.run("SELECT groupArray(toString(number)) FROM numbers(100000000)")
    huge = runner.run("SELECT * FROM numbers(100000000)")  # rows past the limit are not read: cut, and said so
    assert huge.truncated and len(huge.rows) == 1000
    assert incident.snapshot() == before


def test_readonly_is_the_last_line_even_for_what_the_parser_lets_through(incident) -> None:
    """The session itself refuses writes and setting changes, whatever text reaches it."""
    runner = incident.runner(timeout_s=5)
    client = runner._client(runner.limits)  # the read-only session, driven directly (the guard skipped)
    for sql in (
        "INSERT INTO requests (model) VALUES ('x')",
        "SET max_execution_time = 0",
        "SELECT 1 SETTINGS max_result_rows = 0",
        "CREATE TABLE evil (x UInt8) ENGINE = Memory",
        "SELECT * FROM file('/etc/passwd', 'LineAsString')",
    ):
        with pytest.raises(Exception, match=r"Code: 164\b"):  # ClickHouse's READONLY error, not the query echoed
            client.query(sql)
    assert incident.runner().run("SELECT count() AS n FROM requests").rows[0][0] > 0


def test_read_only_statements_pass_the_check() -> None:
    for sql in (
        "SELECT 1",
        "WITH a AS (SELECT 1 AS x) SELECT x FROM a",
        "SELECT 1 UNION ALL SELECT 2",
        "DESCRIBE TABLE requests",
        "SHOW TABLES",
        "SHOW CREATE TABLE samples",
        "EXPLAIN SELECT 1",
        "SELECT 'INTO OUTFILE; DROP TABLE x' AS text",
        "SELECT * FROM numbers(3)",
        "SELECT formatDateTime(now(), '%Y-%m-%d') AS day",
        "SELECT number IN (1, 2) FROM numbers(3)",
        "SELECT model FROM requests WHERE model IN (SELECT model FROM requests_1h)",
        "DESCRIBE (SELECT 1)",
        "SELECT name FROM system.functions LIMIT 3",
    ):
        assert check(sql, "default").kind in ("select", "describe", "show", "explain")
