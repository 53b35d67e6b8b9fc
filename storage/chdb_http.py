"""ClickHouse's HTTP interface over the embedded store: other processes use a chDB directory as a
ClickHouse server.

chDB opens a data directory in one process only. ``fleetscope up`` keeps the store in the
collector's process and runs the alert evaluator and the dashboard in processes of their own
(none of them waits on another's Python); those reach the store through this interface, with
the same client (``clickhouse-connect``, ``http://``) and the same SQL as a ClickHouse server.

In:  the chDB directory (already open in this process or not), a loopback address, a password.
Out: ``ChdbHttpServer``: ``start()`` / ``stop()``, ``url`` (``http://fleetscope:PASSWORD@host:port``,
     for ``clickhouse.url``). A request runs on a connection of its own (its settings, its
     ``USE``), with chDB's work outside the interpreter's lock:
     - queries: the statement in the body or in ``?query=``, ``param_*`` bound server-side,
       other URL parameters applied as settings (``readonly`` included), the result in its
       ``FORMAT`` clause or ``default_format`` (TabSeparated);
     - inserts: ``INSERT ... FORMAT F`` followed by the data (or in ``?query=`` with the data
       as the body, compressed or not), read through a temporary file;
     - ``GET /ping`` -> ``Ok.``; errors as ClickHouse answers them (status, ``Code: N.`` body,
       ``X-ClickHouse-Exception-Code``); a wrong password -> 401 (code 516).
"""

from __future__ import annotations

import base64
import email.parser
import email.policy
import hmac
import json
import os
import re
import secrets
import tempfile
import threading
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlsplit

__all__ = ["ChdbHttpServer", "USER"]

USER = "fleetscope"
MAX_BODY_BYTES = 512 * 1024 * 1024
_NOT_SETTINGS = {
    "query", "database", "default_format", "query_id", "session_id", "session_timeout", "session_check",
    "client_protocol_version", "compress", "decompress", "user", "password", "quota_key", "buffer_size",
    "wait_end_of_query", "enable_http_compression",
}  # fmt: skip
_SETTING = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_NUMBER = re.compile(r"-?[0-9]+(\.[0-9]+)?\Z")
_FORMAT_TAIL = re.compile(r"\bFORMAT\s+([A-Za-z][A-Za-z0-9]*)\s*;?\s*\Z", re.IGNORECASE)
_INSERT = re.compile(r"\s*INSERT\s+INTO\b", re.IGNORECASE)
_INSERT_HEAD = re.compile(r"(\s*INSERT\s+INTO\b.*?)\bFORMAT\s+([A-Za-z][A-Za-z0-9]*)[ \t]*(\r?\n|\Z)", re.I | re.S)
_CODE = re.compile(r"Code: (\d+)\.")
_STATUS = {62: 400, 27: 400, 36: 400, 41: 400, 44: 400, 47: 400, 60: 404, 81: 404, 46: 404, 164: 403}


class ChdbError(Exception):
    """A failed request: the ClickHouse error code and message, and the HTTP status to answer."""

    def __init__(self, code: int, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.status = status or _STATUS.get(code, 500)


class ChdbHttpServer:
    """Serve ``path`` (a chDB directory) over ClickHouse's HTTP interface on ``host:port`` (0: a free port)."""

    def __init__(self, path: Path, host: str = "127.0.0.1", port: int = 0, password: str | None = None) -> None:
        self.path = Path(path)
        self.password = password or secrets.token_urlsafe(18)
        handler = type("_Handler", (_Handler,), {"store": self})
        self._server = ThreadingHTTPServer((host, port), handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="chdb-http", daemon=True)

    @property
    def address(self) -> tuple[str, int]:
        host, port = self._server.server_address[:2]
        return str(host), int(port)

    @property
    def url(self) -> str:
        host, port = self.address
        return f"http://{USER}:{self.password}@{host}:{port}"

    def start(self) -> ChdbHttpServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(10)

    def authorised(self, headers: Any) -> bool:
        given = ""
        auth = headers.get("Authorization", "")
        if auth.startswith("Basic "):
            try:
                user, _, given = base64.b64decode(auth[6:]).decode().partition(":")
            except (ValueError, UnicodeDecodeError):
                return False
            if user != USER:
                return False
        elif headers.get("X-ClickHouse-Key") is not None:
            given = headers.get("X-ClickHouse-Key", "")
            if headers.get("X-ClickHouse-User", USER) != USER:
                return False
        return hmac.compare_digest(given.encode(), self.password.encode())

    def execute(self, request: Request) -> tuple[bytes, str, dict[str, Any]]:
        """Run one request on a connection of its own: (body, format, summary)."""
        import chdb

        statement, data, fmt = request.statement()
        try:
            conn = chdb.connect(str(self.path))  # type: ignore[no-untyped-call]
        except Exception as exc:  # noqa: BLE001 - chdb raises several types
            raise _chdb_error(exc) from None
        try:
            if request.database:
                _run(conn, f"USE `{request.database.replace('`', '')}`")
            for name, value in request.settings.items():
                _run(conn, f"SET {name} = {value if _NUMBER.match(value) else _quote(value)}")
            if not data:
                result = _run(conn, statement, fmt, request.bound)
                return bytes(result.bytes()), fmt, _summary(result)
            with _spooled(data) as infile:
                match = _INSERT_HEAD.match(statement + "\n")
                if match is None:
                    raise ChdbError(
                        62, f"Code: 62. DB::Exception: an insert with data names its FORMAT: {statement[:200]!r}"
                    )
                head, data_format = match.group(1).rstrip(), match.group(2)
                result = _run(
                    conn, f"{head} FROM INFILE {_quote(infile)} FORMAT {data_format}", "TabSeparated", request.bound
                )
                return b"", fmt, {**_summary(result), "written_rows": str(result.rows_read())}
        finally:
            conn.close()


def _run(conn: Any, sql: str, fmt: str = "TabSeparated", params: dict[str, str] | None = None) -> Any:
    try:
        return conn.query(sql, fmt, params=params or {})
    except Exception as exc:  # noqa: BLE001 - chdb raises several types
        raise _chdb_error(exc) from None


def _chdb_error(exc: Exception) -> ChdbError:
    text = str(exc)
    code = _CODE.search(text)
    return ChdbError(int(code.group(1)) if code else 1000, text if code else f"Code: 1000. DB::Exception: {text}")


def _quote(value: str) -> str:
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _summary(result: Any) -> dict[str, Any]:
    return {"read_rows": str(result.rows_read()), "read_bytes": str(result.bytes_read()), "written_rows": "0"}


class _spooled:  # noqa: N801 - used as a context manager, like a function
    """The insert's data in a temporary file (chDB reads an insert's data from a file), removed after."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.name = ""

    def __enter__(self) -> str:
        fd, self.name = tempfile.mkstemp(suffix=".insert", prefix="fleetscope-")
        with os.fdopen(fd, "wb") as out:
            out.write(self.data)
        return self.name

    def __exit__(self, *_exc: object) -> None:
        os.unlink(self.name)


class Request:
    """One HTTP request as ClickHouse reads it: the URL's parameters and the body."""

    def __init__(self, query: str, body: bytes, content_type: str, encoding: str) -> None:
        params = dict(parse_qsl(query, keep_blank_values=True))
        if content_type.startswith("multipart/form-data"):
            params.update(dict(_form_fields(content_type, body)))
            body = b""
        elif encoding and encoding != "identity" and body:
            body = _decompress(body, encoding)
        self.params, self.body = params, body
        self.database = params.get("database") or None
        self.bound = {k[len("param_") :]: v for k, v in params.items() if k.startswith("param_")}
        self.settings: dict[str, str] = {}
        for name, value in params.items():
            if name in _NOT_SETTINGS or name.startswith("param_"):
                continue
            if not _SETTING.match(name):
                raise ChdbError(115, f"Code: 115. DB::Exception: Unknown setting {name!r}.")
            self.settings[name] = value

    def statement(self) -> tuple[str, bytes | None, str]:
        """(statement, insert data or None, output format)."""
        default = self.params.get("default_format") or "TabSeparated"
        text = self.params.get("query")
        if text is not None:  # the statement in the URL: a body is the insert's data, or more of the query
            if _INSERT.match(text):
                return text, self.body, default
            text = text + ("\n" + self.body.decode("utf-8") if self.body else "")
        else:
            if _INSERT.match(self.body[:64].decode("utf-8", "replace")):
                match = _INSERT_HEAD.match(self.body.decode("latin-1"))
                if match is not None and match.end() < len(self.body):
                    return match.group(0).rstrip(), self.body[match.end() :], default
            text = self.body.decode("utf-8")
        if not text.strip():
            raise ChdbError(62, "Code: 62. DB::Exception: Empty query.", 400)
        tail = _FORMAT_TAIL.search(text)
        if tail is not None and not _INSERT.match(text):
            return text[: tail.start()], None, tail.group(1)
        return text, None, default


def _form_fields(content_type: str, body: bytes) -> Iterator[tuple[str, str]]:
    message = email.parser.BytesParser(policy=email.policy.HTTP).parsebytes(
        f"Content-Type: {content_type}\r\n\r\n".encode() + body
    )
    for part in message.iter_parts():
        name = part.get_param("name", header="content-disposition")
        if name and not part.get_filename():
            payload = part.get_payload(decode=True)
            yield str(name), payload.decode("utf-8") if isinstance(payload, bytes) else ""


def _decompress(body: bytes, encoding: str) -> bytes:
    from clickhouse_connect.driver._backend.chdb_backend import _decompress as decompress

    try:
        return bytes(decompress(body, encoding))
    except Exception as exc:  # noqa: BLE001 - each codec raises its own
        raise ChdbError(353, f"Code: 353. DB::Exception: cannot decompress a {encoding!r} body: {exc}", 400) from None


class _Handler(BaseHTTPRequestHandler):
    store: ChdbHttpServer
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: the collector's log is for the fleet, not for each query."""

    def do_GET(self) -> None:
        if urlsplit(self.path).path in ("/ping", "/ping/"):
            self._answer(200, b"Ok.\n", {"Content-Type": "text/plain; charset=UTF-8"})
            return
        self._serve(b"")

    def do_POST(self) -> None:
        try:
            body = self._body()
        except ChdbError as exc:
            self._fail(exc)
            self.close_connection = True
            return
        self._serve(body)

    def _body(self) -> bytes:
        """The request's body, sent whole (Content-Length) or in chunks (an insert streams its blocks)."""
        too_big = ChdbError(1001, f"Code: 1001. DB::Exception: a body over {MAX_BODY_BYTES} bytes", 413)
        if "chunked" not in self.headers.get("Transfer-Encoding", "").lower():
            length = int(self.headers.get("Content-Length") or 0)
            if length > MAX_BODY_BYTES:
                raise too_big
            return self.rfile.read(length) if length else b""
        chunks: list[bytes] = []
        total = 0
        while True:
            size = int(self.rfile.readline(64).split(b";")[0].strip() or b"0", 16)
            if size == 0:
                while self.rfile.readline(1024) not in (b"\r\n", b"\n", b""):  # trailers
                    pass
                return b"".join(chunks)
            total += size
            if total > MAX_BODY_BYTES:
                raise too_big
            chunks.append(self.rfile.read(size))
            self.rfile.readline(8)  # the chunk's CRLF

    def _serve(self, body: bytes) -> None:
        if not self.store.authorised(self.headers):
            self._fail(
                ChdbError(516, f"Code: 516. DB::Exception: {USER}: Authentication failed: password is incorrect.", 401)
            )
            return
        query_id = str(uuid.uuid4())
        try:
            parts = urlsplit(self.path)
            request = Request(
                parts.query, body, self.headers.get("Content-Type", ""), self.headers.get("Content-Encoding", "")
            )
            out, fmt, summary = self.store.execute(request)
        except ChdbError as exc:
            self._fail(exc, query_id)
            return
        except (UnicodeDecodeError, ValueError) as exc:
            self._fail(ChdbError(27, f"Code: 27. DB::Exception: cannot read the request: {exc}", 400), query_id)
            return
        self._answer(
            200,
            out,
            {
                "Content-Type": "application/octet-stream"
                if fmt.startswith(("Native", "RowBinary", "Arrow", "Parquet"))
                else "text/plain; charset=UTF-8",
                "X-ClickHouse-Format": fmt,
                "X-ClickHouse-Query-Id": query_id,
                "X-ClickHouse-Summary": json.dumps(summary),
            },
        )

    def _fail(self, exc: ChdbError, query_id: str = "") -> None:
        text = str(exc).strip()
        self._answer(
            exc.status,
            (text if text.startswith("Code:") else f"Code: {exc.code}. DB::Exception: {text}").encode() + b"\n",
            {
                "Content-Type": "text/plain; charset=UTF-8",
                "X-ClickHouse-Exception-Code": str(exc.code),
                "X-ClickHouse-Query-Id": query_id,
            },
        )

    def _answer(self, status: int, body: bytes, headers: dict[str, str]) -> None:
        self.send_response(status)
        for name, value in headers.items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
