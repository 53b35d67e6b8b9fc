"""The ``requests`` table's columns as the collector writes them, and the defaults of the quality ones.

In:  request rows (dicts) or request columns (dict of lists) from any source: the gateway request
     log (``collector.requestlog``), engine spans (``collector.otlp``), other gateways' records
     (``collector.mapping``).
Out: ``REQUEST_COLUMNS`` (every column the collector writes, ``weight`` included) and the same rows
     or columns with the quality columns a source does not give filled with their defaults
     (``QUALITY_DEFAULTS``: not evaluated, not a shadow; migrations 0014, 0015), so every batch of ``requests`` has the
     same columns whatever its source. The quality fields are issue 43's: a sampled answer scored by
     the gateway's evaluators (docs/quality.md); only fleetscope's gateway log gives them.
"""

from __future__ import annotations

from typing import Any

__all__ = ["AUDIT_DEFAULTS", "QUALITY_COLUMNS", "QUALITY_DEFAULTS", "REQUEST_COLUMNS", "fill_columns", "fill_row"]

# column -> the value of a row that was not evaluated (the table's DEFAULT, migrations 0014 and 0015)
QUALITY_DEFAULTS: dict[str, Any] = {
    "evaluated": 0,
    "answer_hash": "",
    "answer_chars": 0,
    "truncated": 0,
    "empty_answer": 0,
    "refusal": 0,
    "repetition": 0.0,
    "json_valid": -1,  # -1: JSON not asked, 0: asked and invalid, 1: valid
    "answer_text": "",  # only with the gateway's quality.keep_text
}
QUALITY_COLUMNS = tuple(QUALITY_DEFAULTS)
# the router audit (migration 0015): set on a shadow request's row only
AUDIT_DEFAULTS: dict[str, Any] = {
    "audit_of": "",
    "audit_direction": "",
    "agreement": -1.0,
    "judge_routed": -1.0,
    "judge_shadow": -1.0,
}
_DEFAULTS = {**QUALITY_DEFAULTS, **AUDIT_DEFAULTS}

REQUEST_COLUMNS = (
    "ts",
    "source",
    "gateway",
    "request_id",
    "trace_id",
    "replica",
    "model",
    "tenant",
    "route",
    "status_code",
    "finish_reason",
    "prompt_tokens",
    "completion_tokens",
    "cached_tokens",
    "max_tokens",
    "ttft_seconds",
    "e2e_seconds",
    "queue_seconds",
    "prefill_seconds",
    "decode_seconds",
    "tpot_seconds",
    "weight",
    "session",
    "route_reason",
    "outcome",
    "error",
    "itl_seconds",
    "prefix_hash",
    "stream",
    *QUALITY_COLUMNS,
    *AUDIT_DEFAULTS,
)


def fill_row(row: dict[str, Any]) -> dict[str, Any]:
    """``row`` with each quality (and audit) column it lacks set to its default (in place; returned)."""
    for name, default in _DEFAULTS.items():
        if name not in row:
            row[name] = default
    return row


def fill_columns(columns: dict[str, list[Any]], n: int) -> dict[str, list[Any]]:
    """``columns`` (``n`` rows) with each quality (and audit) column they lack as ``n`` defaults (in place;
    returned)."""
    for name, default in _DEFAULTS.items():
        if name not in columns:
            columns[name] = [default] * n
    return columns
