"""The errors of the alerts package, all under one base.

In:  nothing.
Out: ``AlertsError``, the base of every error ``alerts`` defines:

    AlertsError(Exception)
    ├── ExprError(AlertsError, ValueError)  a rule's ``expr`` cannot be read (``alerts.expr.parse_expr``);
    │                                       a ``ValueError`` too, so rule validation (pydantic) and
    │                                       callers that catch ``ValueError`` read it as before
    ├── SignalError(AlertsError)            an expression could not be evaluated: the store failed, or
    │                                       the rule's SQL did (``alerts.expr.evaluate``); the rule's
    │                                       ``error`` policy decides what it means
    └── ReceiverError(AlertsError, ValueError)  a notification in the outbox cannot go where its
                                            receiver is configured now (an Alertmanager URL that
                                            was removed): delivery marks it failed with this message

Invalid settings, rules, matchers and silences are refused with ``ValueError`` raised in
pydantic validators and constructors (pydantic turns them into its ``ValidationError``; rule
files into ``common.yamlfile.YamlConfigError``), not with classes of their own.
"""

from __future__ import annotations

__all__ = ["AlertsError", "ExprError", "ReceiverError", "SignalError"]


class AlertsError(Exception):
    """The base of every error the alerts package defines."""


class ExprError(AlertsError, ValueError):
    """A rule's ``expr`` cannot be read: an unknown signal, a bad parameter, refused SQL."""


class SignalError(AlertsError):
    """The expression could not be evaluated (the store failed, or the SQL did)."""


class ReceiverError(AlertsError, ValueError):
    """A notification cannot be sent to its receiver as the receiver is configured now."""
