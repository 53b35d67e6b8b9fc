"""Exposition parser: Prometheus text (0.0.4) or OpenMetrics text -> samples and metric types.

In:  the body of a ``/metrics`` response (``str``) and its ``Content-Type`` (optional).
Out: an ``Exposition``: ``samples`` (``Sample(name, labels, value, timestamp)``, timestamp in
     seconds or None), ``types`` and ``helps`` by metric family, and ``exemplars``.
     Malformed input raises ``ExpositionError`` with the line number and the reason; the
     caller fails the whole scrape (no partial samples).

Handled: label-value escapes ``\\\\ \\" \\n``; ``NaN``/``+Inf``/``-Inf``; timestamps (ms in text
format, seconds in OpenMetrics); ``# EOF`` (required in OpenMetrics, nothing after it);
exemplars after `` # ``; ``_created`` series; trailing commas in label sets; tabs.

Speed: a ``SeriesCache`` (one per scrape target, like Prometheus' scrape cache) remembers the
parsed name and labels of each series text, so a scrape of an exposition seen before costs a
dictionary lookup and a float conversion per sample. Without a cache every series is parsed.
``bench/bench_exposition.py`` measures both against prometheus_client's parser.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from types import MappingProxyType
from typing import NamedTuple

from collector.errors import CollectorError

__all__ = ["Exposition", "ExpositionError", "Sample", "SeriesCache", "parse", "is_openmetrics"]

OPENMETRICS = "application/openmetrics-text"
_METRIC_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*\Z")
_LABEL = re.compile(r'[ \t]*([a-zA-Z_][a-zA-Z0-9_]*)[ \t]*=[ \t]*"((?:[^"\\\n]|\\.)*)"[ \t]*')
_ESCAPE = re.compile(r'\\[\\n"]')
_ESCAPES = {"\\\\": "\\", "\\n": "\n", '\\"': '"'}
_EMPTY: Mapping[str, str] = MappingProxyType({})
_TYPES = {"counter", "gauge", "histogram", "summary", "untyped", "unknown", "gaugehistogram", "stateset", "info"}


class ExpositionError(CollectorError, ValueError):
    """Malformed exposition: ``line`` (1-based) and ``reason`` say where and why."""

    def __init__(self, line: int, reason: str, text: str = "") -> None:
        self.line = line
        self.reason = reason
        snippet = f": {text[:120]!r}" if text else ""
        super().__init__(f"line {line}: {reason}{snippet}")


class Sample(NamedTuple):
    name: str
    labels: Mapping[str, str]
    value: float
    timestamp: float | None


class Exemplar(NamedTuple):
    sample_index: int
    labels: Mapping[str, str]
    value: float
    timestamp: float | None


class Exposition:
    """A parsed exposition, columnar: ``series[i]`` is ``(name, labels)`` of sample i (shared,
    read-only objects), ``values[i]`` its value, ``timestamps[i]`` its timestamp in seconds or
    None. ``samples`` gives the same as ``Sample`` tuples."""

    __slots__ = ("series", "values", "timestamps", "types", "helps", "exemplars", "openmetrics", "_samples")

    def __init__(
        self,
        series: list[tuple[str, Mapping[str, str]]],
        values: list[float],
        timestamps: list[float | None],
        types: dict[str, str],
        helps: dict[str, str],
        exemplars: list[Exemplar],
        openmetrics: bool,
    ) -> None:
        self.series = series
        self.values = values
        self.timestamps = timestamps
        self.types = types
        self.helps = helps
        self.exemplars = exemplars
        self.openmetrics = openmetrics
        self._samples: list[Sample] | None = None

    def __len__(self) -> int:
        return len(self.values)

    @property
    def samples(self) -> list[Sample]:
        if self._samples is None:
            self._samples = [
                Sample(name, labels, value, ts)
                for (name, labels), value, ts in zip(self.series, self.values, self.timestamps, strict=True)
            ]
        return self._samples


class SeriesCache:
    """Series text -> (name, read-only labels). Keeps the series of the last two scrapes."""

    __slots__ = ("entries", "comments", "_previous")

    def __init__(self) -> None:
        self.entries: dict[str, tuple[str, Mapping[str, str]]] = {}
        self.comments: dict[str, tuple[str, str, str] | None] = {}
        self._previous = 0

    def trim(self, seen: int) -> None:
        """After a scrape with ``seen`` series: drop everything if the cache grew past 2x."""
        if len(self.entries) > 2 * max(seen, self._previous, 64) or len(self.comments) > 4 * max(seen, 64):
            self.entries.clear()
            self.comments.clear()
        self._previous = seen


def is_openmetrics(content_type: str | None, text: str) -> bool:
    if content_type:
        return content_type.split(";", 1)[0].strip().lower() == OPENMETRICS
    return text.rstrip().endswith("\n# EOF") or text.strip() == "# EOF"


def _unescape(value: str) -> str:
    return _ESCAPE.sub(lambda m: _ESCAPES[m.group(0)], value) if "\\" in value else value


def _parse_labels(body: str, lineno: int, line: str) -> dict[str, str]:
    labels: dict[str, str] = {}
    pos, end = 0, len(body)
    while pos < end:
        match = _LABEL.match(body, pos)
        if match is None:
            if body[pos:].strip() == "":
                break
            raise ExpositionError(lineno, "invalid label set", line)
        name = match.group(1)
        if name in labels:
            raise ExpositionError(lineno, f"duplicate label {name!r}", line)
        labels[name] = _unescape(match.group(2))
        pos = match.end()
        if pos < end:
            if body[pos] != ",":
                raise ExpositionError(lineno, "expected ',' between labels", line)
            pos += 1  # a trailing comma is allowed
    return labels


def _series(key: str, lineno: int, line: str) -> tuple[str, Mapping[str, str]]:
    """Parse ``name`` or ``name{labels}`` (the text before the value)."""
    brace = key.find("{")
    if brace < 0:
        name = key.strip()
        if not _METRIC_NAME.match(name):
            raise ExpositionError(lineno, "invalid metric name", line)
        return name, _EMPTY
    name = key[:brace].strip()
    if not _METRIC_NAME.match(name):
        reason = "quoted (UTF-8) metric names are not supported" if not name else "invalid metric name"
        raise ExpositionError(lineno, reason, line)
    if not key.endswith("}"):
        raise ExpositionError(lineno, "unterminated label set", line)
    return name, MappingProxyType(_parse_labels(key[brace + 1 : -1], lineno, line))


def _number(token: str, lineno: int, line: str) -> float:
    if "_" in token:  # float() accepts 1_000; the exposition formats do not
        raise ExpositionError(lineno, f"invalid number {token!r}", line)
    try:
        return float(token)
    except ValueError:
        raise ExpositionError(lineno, f"invalid number {token!r}", line) from None


def _timestamp(token: str, openmetrics: bool, lineno: int, line: str) -> float:
    """Text format: integer milliseconds (as Prometheus parses them); OpenMetrics: finite seconds."""
    if not openmetrics:
        digits = token[1:] if token[:1] in "+-" else token
        if not digits.isdigit() or not digits.isascii():
            raise ExpositionError(lineno, f"invalid timestamp {token!r} (integer milliseconds expected)", line)
        return float(int(token))
    value = _number(token, lineno, line)
    if math.isnan(value) or math.isinf(value):
        raise ExpositionError(lineno, f"invalid timestamp {token!r}", line)
    return value


def _split_series(line: str) -> tuple[str, str]:
    """(series text, rest) of a sample line; quote-aware only when the cheap split is unsafe."""
    close = line.rfind("}")
    if close >= 0:
        return line[: close + 1], line[close + 1 :]
    space = line.find(" ")
    if "\t" in line:
        tab = line.find("\t")
        space = tab if space < 0 else min(space, tab)
    return (line, "") if space < 0 else (line[:space], line[space:])


def _comment(line: str, lineno: int, openmetrics: bool, types: dict[str, str], helps: dict[str, str]) -> bool:
    """Handle a ``#`` line; returns True on ``# EOF`` (OpenMetrics; in the text format it is an
    ordinary comment). ``#TYPE`` without a space is an ordinary comment, as in prometheus_client."""
    if line[1:2] not in (" ", "\t"):
        if openmetrics:
            raise ExpositionError(lineno, "a comment must start with '# '", line)
        return False
    parts = line[1:].split(None, 2)
    if not parts:
        return False
    kind = parts[0]
    if kind == "EOF" and len(parts) == 1:
        return openmetrics
    if kind not in ("TYPE", "HELP", "UNIT"):
        if openmetrics:
            raise ExpositionError(
                lineno, "comments other than TYPE, HELP, UNIT and EOF are not allowed in OpenMetrics", line
            )
        return False
    if len(parts) < 2 or not _METRIC_NAME.match(parts[1]):
        raise ExpositionError(lineno, f"{kind} needs a metric name", line)
    name = parts[1]
    if kind == "TYPE":
        if len(parts) < 3 or parts[2].strip() not in _TYPES:
            raise ExpositionError(lineno, "unknown or missing metric type", line)
        if name in types:
            raise ExpositionError(lineno, f"second TYPE line for {name}", line)
        types[name] = parts[2].strip()
    elif kind == "HELP":
        helps[name] = _unescape(parts[2]) if len(parts) > 2 else ""
    return False


def parse(text: str, content_type: str | None = None, cache: SeriesCache | None = None) -> Exposition:
    """Parse an exposition. ``content_type`` selects OpenMetrics; without one, a text whose
    last line is ``# EOF`` is read as OpenMetrics. Raises ``ExpositionError``."""
    openmetrics = is_openmetrics(content_type, text)
    if cache is None:
        cache = SeriesCache()
    result = None if openmetrics else _parse_text_fast(text, cache)
    if result is None:
        result = _parse_lines(text, openmetrics, cache)
    cache.trim(len(result))
    return result


def _comment_info(line: str) -> tuple[str, str, str] | None:
    """(kind, metric name, payload) of a TYPE/HELP line, None for other comments."""
    parts = line[1:].split(None, 2)
    if len(parts) < 2 or parts[0] not in ("TYPE", "HELP") or not _METRIC_NAME.match(parts[1]):
        return None
    payload = parts[2] if len(parts) > 2 else ""
    if parts[0] == "TYPE":
        payload = payload.strip()
        if payload not in _TYPES:
            return None
    else:
        payload = _unescape(payload)
    return parts[0], parts[1], payload


def _parse_text_fast(text: str, cache: SeriesCache) -> Exposition | None:
    """The common case of the text format in one pass: each sample line splits at its last
    space into series text and value; a series text seen before is a cache hit, a new one is
    parsed and cached. Returns None as soon as a line is unusual (a timestamp, a tab, a bad
    number, a malformed line...): the careful line-by-line parser then handles it or reports
    the error with its line number."""
    entries = cache.entries
    comments = cache.comments
    get = entries.get
    get_comment = comments.get
    series: list[tuple[str, Mapping[str, str]]] = []
    tokens: list[str] = []
    add_series = series.append
    add_token = tokens.append
    types: dict[str, str] = {}
    helps: dict[str, str] = {}
    for line in text.split("\n"):
        head, _, last = line.rpartition(" ")
        ref = get(head)
        if ref is not None:
            add_series(ref)
            add_token(last)
        elif not line:
            continue
        elif line[0] == "#":
            if line in comments:
                info = get_comment(line)
            else:
                stripped = line.rstrip("\r")
                if stripped.startswith(("# TYPE", "# HELP", "#\tTYPE", "#\tHELP")):
                    info = _comment_info(stripped)
                    if info is None:
                        return None  # malformed TYPE/HELP (or # EOF): the careful path decides
                else:
                    info = None
                comments[line] = info
            if info is None:
                continue
            kind, name, payload = info
            if kind == "TYPE":
                if name in types:
                    return None
                types[name] = payload
            else:
                helps[name] = payload
        elif not head or line[0] in " \t":
            return None
        else:
            try:
                ref = _series(head, 0, line)
            except ExpositionError:
                return None
            entries[head] = ref
            add_series(ref)
            add_token(last)
    if "_" in "".join(tokens):
        return None
    try:
        values = list(map(float, tokens))
    except ValueError:
        return None
    return Exposition(series, values, [None] * len(values), types, helps, [], False)


def _parse_lines(text: str, openmetrics: bool, cache: SeriesCache) -> Exposition:
    entries = cache.entries
    series_refs: list[tuple[str, Mapping[str, str]]] = []
    values_out: list[float] = []
    timestamps: list[float | None] = []
    exemplars: list[Exemplar] = []
    types: dict[str, str] = {}
    helps: dict[str, str] = {}
    ts_divisor = 1.0 if openmetrics else 1000.0  # text format: milliseconds
    eof = False
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    for lineno, raw in enumerate(lines, 1):
        line = raw[:-1] if raw.endswith("\r") else raw
        if eof:
            raise ExpositionError(lineno, "content after # EOF", line)
        if not line:
            if openmetrics:
                raise ExpositionError(lineno, "empty line in OpenMetrics", line)
            continue
        if line[0] == "#":
            eof = _comment(line, lineno, openmetrics, types, helps)
            if not openmetrics and not eof:
                cache.comments[line] = _comment_info(line)
            continue
        if line[0] in " \t":
            line = line.lstrip(" \t")
            if not line:
                continue
            if line[0] == "#":
                eof = _comment(line, lineno, openmetrics, types, helps)
                continue
        exemplar = None
        if openmetrics and " # " in line:
            line, exemplar = _split_exemplar(line, lineno)
        key, rest = _split_series(line)
        series = entries.get(key)
        if series is None:
            series = _series(key, lineno, line)
            if not openmetrics:
                entries[key] = series
        values = rest.split()
        if not values or len(values) > 2 or (rest and rest[0] not in " \t"):
            raise ExpositionError(lineno, "expected a value and an optional timestamp", line)
        value = _number(values[0], lineno, line)
        timestamp = _timestamp(values[1], openmetrics, lineno, line) / ts_divisor if len(values) == 2 else None
        if exemplar is not None:
            exemplars.append(_exemplar(exemplar, len(values_out), lineno, line))
        series_refs.append(series)
        values_out.append(value)
        timestamps.append(timestamp)
    if openmetrics and not eof:
        raise ExpositionError(len(lines), "OpenMetrics exposition does not end with # EOF")
    return Exposition(series_refs, values_out, timestamps, types, helps, exemplars, openmetrics)


def _split_exemplar(line: str, lineno: int) -> tuple[str, str]:
    """Split ``sample # exemplar`` at the first `` # `` outside quotes."""
    in_quotes = False
    i = 0
    while i < len(line):
        c = line[i]
        if c == "\\" and in_quotes:
            i += 2
            continue
        if c == '"':
            in_quotes = not in_quotes
        elif not in_quotes and line.startswith(" # ", i):
            return line[:i], line[i + 3 :]
        i += 1
    return line, None  # type: ignore[return-value]


def _exemplar(text: str, index: int, lineno: int, line: str) -> Exemplar:
    text = text.strip()
    if not text.startswith("{") or "}" not in text:
        raise ExpositionError(lineno, "invalid exemplar", line)
    close = text.rfind("}")
    labels = _parse_labels(text[1:close], lineno, line)
    values = text[close + 1 :].split()
    if not values or len(values) > 2:
        raise ExpositionError(lineno, "invalid exemplar value", line)
    ts = _number(values[1], lineno, line) if len(values) == 2 else None
    return Exemplar(index, MappingProxyType(labels), _number(values[0], lineno, line), ts)
