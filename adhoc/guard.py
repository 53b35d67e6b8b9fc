"""The statement check of ad-hoc SQL: query text -> accepted (one read-only statement) or
``Refused`` with a message that says what was refused and why.

In:  the text a user typed (CLI, dashboard, HTTP endpoint).
Out: ``check(sql)`` -> ``Checked`` (the kind of statement and the tables it reads), or raises
     ``Refused``. The check parses with sqlglot's ClickHouse dialect (no regular expressions on
     the query itself) and allows exactly one of: ``SELECT`` (with ``WITH``, ``UNION``, joins,
     subqueries), ``DESCRIBE``, ``SHOW TABLES`` / ``SHOW CREATE TABLE`` / ``SHOW COLUMNS``, and
     ``EXPLAIN`` of a ``SELECT``. Refused: anything else (DDL, DML, ``SYSTEM``, ``KILL``,
     ``SET``, ``USE``, access management), more than one statement, a ``SETTINGS`` or
     ``FORMAT`` clause or ``INTO OUTFILE`` (fleetscope sets the limits and the format), table
     functions other than ``numbers``/``zeros``/``values``/``generate_series``, functions that
     reach files, the network, programs or other databases (``file``, ``url``, ``s3``,
     ``remote``, ``executable``, ``postgresql``, ``mysql``, ``dictGet``, ``joinGet``, ...;
     also after ``IN`` and under ``DESCRIBE``), tables of other databases, ``system`` tables
     other than a few harmless ones and ``information_schema`` (they list every database).

This is the first line of defence; ``adhoc.runner`` runs what passes in a ClickHouse session
set to ``readonly=1`` with time, row and memory limits the query text cannot change (the last
line). Both are needed: ``readonly=1`` alone still lets ``SELECT file('/etc/passwd')`` read a
file and ``INTO OUTFILE`` write one (seen on chDB 26.9).
"""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass, field

import sqlglot
from sqlglot import exp
from sqlglot.errors import ParseError, TokenError

from adhoc.errors import AdhocError

__all__ = ["ALLOWED_SYSTEM_TABLES", "Checked", "Refused", "check"]

# table functions that only compute
ALLOWED_TABLE_FUNCTIONS = frozenset(
    {"numbers", "numbers_mt", "zeros", "zeros_mt", "values", "generate_series", "generateseries", "view", "null"}
)
# functions (scalar or table) that reach outside the store: files, the network, programs, other databases
DENIED_FUNCTIONS = frozenset(
    {
        "file",
        "filecluster",
        "url",
        "urlcluster",
        "s3",
        "s3cluster",
        "gcs",
        "cosn",
        "oss",
        "azureblobstorage",
        "azureblobstoragecluster",
        "hdfs",
        "hdfscluster",
        "remote",
        "remotesecure",
        "cluster",
        "clusterallreplicas",
        "executable",
        "executablepool",
        "input",
        "jdbc",
        "odbc",
        "mysql",
        "postgresql",
        "sqlite",
        "mongodb",
        "redis",
        "iceberg",
        "icebergs3",
        "icebergazure",
        "iceberghdfs",
        "icebergcluster",
        "deltalake",
        "deltalakecluster",
        "hudi",
        "hudicluster",
        "dictionary",
        "loop",
        "fuzzjson",
        "fuzzquery",
        "mergetreeindex",
        "mergetreeparts",
        "prometheusquery",
        "ytsaurus",
        "arrowflight",
        "paimon",
        "getsetting",
        "getsettingordefault",
        "getmacro",
        "getclientsetting",
    }
)
# the system tables a user may read: the schema browser's and harmless generators
# (the schema browser reads system.tables/columns itself, for this database only: ``ReadOnlyRunner.schema``)
ALLOWED_SYSTEM_TABLES = frozenset(
    {"one", "numbers", "numbers_mt", "zeros", "zeros_mt", "functions", "table_functions", "data_type_families"}
)
# function families that read dictionaries, join tables or server settings by name
DENIED_PREFIXES = ("dict", "joinget", "getserversetting", "getsetting", "getmacro")
_EXPLAIN = re.compile(
    r"^\s*EXPLAIN(?:\s+(?:AST|SYNTAX|QUERY\s+TREE|PLAN|PIPELINE|ESTIMATE))?\s+(.*)$", re.IGNORECASE | re.DOTALL
)
_SHOW = re.compile(
    r"^\s*SHOW\s+(?:TABLES|(?:CREATE\s+TABLE|COLUMNS\s+FROM)\s+([A-Za-z_][\w.`]*))\s*;?\s*$", re.IGNORECASE | re.DOTALL
)
_WORD = re.compile(r"^\s*([A-Za-z]+)(?:\s+([A-Za-z]+))?")
MAX_CHARS = 100_000
_REASONS = {
    "SYSTEM": "controls the server",
    "KILL": "stops other queries",
    "GRANT": "changes access",
    "REVOKE": "changes access",
    "CREATE": "changes the store",
    "OPTIMIZE": "rewrites table parts",
    "ATTACH": "changes the store",
    "DETACH": "changes the store",
    "RENAME": "changes the store",
    "EXCHANGE": "changes the store",
    "BACKUP": "writes files",
    "RESTORE": "changes the store",
    "UNDROP": "changes the store",
    "WATCH": "never ends",
    "CHECK": "is an administrative command",
    "SET": "changes settings",
    "USE": "changes the session",
}
_WRITES = {"INSERT", "ALTER", "DELETE", "UPDATE", "DROP", "TRUNCATE", "REPLACE", "MOVE"}


class Refused(AdhocError, ValueError):
    """The query is not run; the message says why, in one or two sentences."""


@dataclass(frozen=True)
class Checked:
    sql: str
    kind: str  # select | describe | show | explain
    tables: list[str] = field(default_factory=list)


def check(sql: str, database: str | None = None) -> Checked:
    """Accept one read-only statement or raise ``Refused`` (see the module docstring)."""
    try:
        return _check(sql, database)
    except RecursionError:
        raise Refused("the query is nested too deeply to check") from None


def _check(sql: str, database: str | None) -> Checked:
    text = (sql or "").strip()
    if not text:
        raise Refused("the query is empty")
    if len(text) > MAX_CHARS:
        raise Refused(f"the query is {len(text):,} characters long; the limit is {MAX_CHARS:,}")
    if re.search(r"\bINTO\s+OUTFILE\b", text, re.IGNORECASE) and _parses_with_outfile(text):
        raise Refused("INTO OUTFILE writes a file on the server: refused (choose the output with --format/--output)")
    try:
        statements = [
            s for s in sqlglot.parse(text, read="clickhouse", error_level=sqlglot.ErrorLevel.RAISE) if s is not None
        ]
    except (ParseError, TokenError) as exc:
        words = _WORD.match(text)
        word = words.group(1).upper() if words else ""
        if words and (
            word in _REASONS or word in _WRITES
        ):  # a statement fleetscope never runs, whether or not sqlglot knows it
            what = " ".join(w for w in words.groups() if w).upper()
            raise Refused(
                f"only SELECT, DESCRIBE, SHOW and EXPLAIN run here; {what} {_REASONS.get(word, 'changes the store')}"
            ) from None
        first = str(exc).strip().splitlines()[0]
        raise Refused(f"cannot parse the query as ClickHouse SQL: {first}") from None
    if len(statements) != 1:
        kinds = ", ".join(_kind(s) for s in statements)
        raise Refused(
            f"one statement per query, got {len(statements)} ({kinds}): remove the extra ';'-separated statements"
        )
    (tree,) = statements
    if isinstance(tree, exp.Command):
        return _command(tree, text, database)
    if isinstance(tree, exp.Describe):
        target = tree.this
        if not isinstance(target, exp.Table | exp.Subquery) or isinstance(target.this, exp.Func):
            raise Refused("DESCRIBE runs here on a table of the store or a (SELECT ...), not on a table function")
        tables = _tables(tree, database)
        return Checked(text, "describe", tables)
    if not isinstance(tree, exp.Query):
        raise Refused(
            f"only SELECT, DESCRIBE, SHOW and EXPLAIN run here; this is {_kind(tree)}, which "
            f"{'changes the store' if _writes(tree) else 'is not a query'}"
        )
    return Checked(text, "select", _tables(tree, database))


def _parses_with_outfile(text: str) -> bool:
    """``INTO OUTFILE`` outside a string literal or comment (sqlglot's tokenizer decides)."""
    try:
        tokens = sqlglot.Dialect.get_or_raise("clickhouse").tokenize(text)
    except (TokenError, ValueError):
        return True
    words = [t.text.upper() for t in tokens if t.token_type.name not in ("STRING", "COMMENT")]
    return any(a == "INTO" and b == "OUTFILE" for a, b in itertools.pairwise(words))


def _kind(tree: exp.Expr) -> str:
    if isinstance(tree, exp.Command):
        return f"{str(tree.this).upper()}"
    name = type(tree).__name__.upper()
    return {
        "ALTER": "ALTER",
        "INSERT": "INSERT",
        "DELETE": "DELETE",
        "DROP": "DROP",
        "CREATE": "CREATE",
        "UPDATE": "UPDATE",
        "SET": "SET",
        "USE": "USE",
        "TRUNCATETABLE": "TRUNCATE",
        "KILL": "KILL",
        "GRANT": "GRANT",
        "REVOKE": "REVOKE",
    }.get(name, name)


def _writes(tree: exp.Expr) -> bool:
    return isinstance(
        tree, exp.Insert | exp.Delete | exp.Update | exp.Drop | exp.Create | exp.Alter | exp.TruncateTable | exp.Merge
    )


def _command(tree: exp.Command, text: str, database: str | None) -> Checked:
    word = str(tree.this).upper()
    if word == "EXPLAIN":
        m = _EXPLAIN.match(text)
        inner = m.group(1).strip() if m else ""
        if not re.match(r"^(SELECT|WITH)\b", inner, re.IGNORECASE):
            raise Refused("EXPLAIN runs here only on a SELECT (EXPLAIN [AST|SYNTAX|PLAN|PIPELINE|ESTIMATE] SELECT ...)")
        checked = check(inner, database)
        return Checked(text, "explain", checked.tables)
    if word == "SHOW":
        m = _SHOW.match(text)
        if not m:
            raise Refused("only SHOW TABLES, SHOW CREATE TABLE name and SHOW COLUMNS FROM name run here")
        table = (m.group(1) or "").replace("`", "")
        if table:
            _check_table(table.split(".")[-1], table.split(".")[0] if "." in table else "", database)
        return Checked(text, "show", [table] if table else [])
    words = _WORD.match(text)
    what = " ".join(w for w in (words.groups() if words else ()) if w).upper() or word
    reason = _REASONS.get(word, "is not a query")
    if (
        word == "CREATE"
        and words
        and (words.group(2) or "").upper() in ("USER", "ROLE", "QUOTA", "POLICY", "PROFILE", "SETTINGS", "ROW")
    ):
        reason = "changes access"
    raise Refused(f"only SELECT, DESCRIBE, SHOW and EXPLAIN run here; {what} {reason}")


def _clauses(tree: exp.Expr, database: str | None = None) -> None:
    for node in tree.walk():
        if not isinstance(node, exp.Expression):
            continue
        if isinstance(node, exp.Query):  # (formatDateTime and friends carry a "format" argument too)
            if node.args.get("settings"):
                raise Refused(
                    "a SETTINGS clause is not allowed: fleetscope sets the query's limits (time, rows, "
                    "memory) and read-only mode itself"
                )
            if node.args.get("format"):
                raise Refused(
                    "a FORMAT clause is not allowed: choose the output format with --format (or the page's download)"
                )
        if isinstance(node, exp.Func):
            name = _func_name(node)
            if name in DENIED_FUNCTIONS or name.startswith(DENIED_PREFIXES):
                raise Refused(
                    f"{name}() reaches files, the network, programs, other databases or the server's "
                    "configuration: refused (ad-hoc SQL reads the fleetscope store only)"
                )
        if isinstance(node, exp.In) and node.args.get("field") is not None:
            _in_target(node.args["field"], database)


def _func_name(node: exp.Func) -> str:
    return (node.name if isinstance(node, exp.Anonymous) else node.sql_name()).lower()


def _in_target(target: exp.Expression, database: str | None) -> None:
    """``x IN db.table`` / ``x IN tablefunction(...)``: ClickHouse reads that table."""
    if isinstance(target, exp.Func):
        name = _func_name(target)
        if name not in ALLOWED_TABLE_FUNCTIONS:
            raise Refused(
                f"IN {name}(...) reads through a table function: only "
                f"{', '.join(sorted(ALLOWED_TABLE_FUNCTIONS - {'generateseries'}))} run here"
            )
        return
    if isinstance(target, exp.Column):
        parts = [p.name for p in target.parts]
        if len(parts) >= 2:
            _check_table(parts[-1], parts[-2], database)


def _tables(tree: exp.Expr, database: str | None) -> list[str]:
    _clauses(tree, database)
    ctes = {cte.alias_or_name for cte in tree.find_all(exp.CTE)}
    out: list[str] = []
    for table in tree.find_all(exp.Table):
        if isinstance(table.this, exp.Func):
            name = _func_name(table.this)
            if name in DENIED_FUNCTIONS or name not in ALLOWED_TABLE_FUNCTIONS:
                raise Refused(
                    f"the table function {name}() is not allowed: only "
                    f"{', '.join(sorted(ALLOWED_TABLE_FUNCTIONS - {'generateseries'}))} run here"
                )
            continue
        name, db = table.name, table.db
        if not db and name in ctes:
            continue
        _check_table(name, db, database)
        out.append(f"{db}.{name}" if db else name)
    return out


def _check_table(name: str, db: str, database: str | None) -> None:
    if table_catalog := db.lower():
        if table_catalog == "system":
            if name.lower() not in ALLOWED_SYSTEM_TABLES:
                raise Refused(
                    f"system.{name} is not readable here; the system tables allowed are "
                    f"{', '.join(sorted(ALLOWED_SYSTEM_TABLES))}"
                )
        elif database is not None and table_catalog != database.lower():
            raise Refused(f"{db}.{name}: only the fleetscope database ({database}) is readable here")
