"""Alerts: rule files, evaluator, state machine, notifiers and outbox.
May import ``analytics`` and ``storage``.
"""
