"""The SLO targets ``fleetscope up`` records itself, and the ledger that tells them from a person's.

In:  the fleet spec's per-model ``slo`` targets, or a calibration's (model, metric) -> seconds; the
     metadata DB's sessions; the ledger, a JSON file (``data/up/slo-recorded.json``:
     ``"model|metric": seconds``) of what ``up`` recorded.
Out: SLO targets set in the metadata DB where none is there, or where the one there is ``up``'s
     own (a target set by hand, or on the Fleet page, stays); the ledger updated; the targets
     recorded and kept, as labels.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from fleet.spec import FleetSpec

__all__ = ["record_slos", "seed_slos"]


def seed_slos(spec: FleetSpec, sessions: Any, ledger: Path | None = None) -> list[str]:
    """The spec's per-model ``slo`` targets recorded where the metadata DB has none for that model and
    latency (a target set by hand, or changed on the Fleet page, stays); the ones added, as labels.
    ``ledger`` (a JSON file) notes what was recorded, so that a later calibration may replace it."""
    from storage.catalog import SloTarget, set_slo, slo_targets

    have = {(t.model, t.metric) for t in slo_targets(sessions)}
    added = []
    for name, model in sorted(spec.models.items()):
        for metric, seconds in sorted(model.slo.items()):
            if (name, metric) not in have:
                target = SloTarget(name, metric, seconds)
                set_slo(sessions, target)
                added.append(target.label)
                if ledger is not None:
                    _note(ledger, {(name, metric): seconds})
    return added


def record_slos(sessions: Any, wanted: dict[tuple[str, str], float], ledger: Path) -> tuple[list[str], list[str]]:
    """Record ``wanted`` ((model, metric) -> seconds) as SLO targets, except where the metadata DB
    holds one that ``up`` did not record (``ledger`` says what it did): a target set by hand stays.
    Returns (the targets recorded, the ones kept), as labels."""
    from storage.catalog import SloTarget, set_slo, slo_targets

    have = {(t.model, t.metric): t for t in slo_targets(sessions)}
    ours = _ledger(ledger)
    recorded: list[str] = []
    kept: list[str] = []
    noted: dict[tuple[str, str], float] = {}
    for (model, metric), seconds in sorted(wanted.items()):
        current = have.get((model, metric))
        if current is not None and ours.get(f"{model}|{metric}") != current.threshold_seconds:
            kept.append(current.label)  # set by a person (fleetscope slo set, the Fleet page)
            continue
        target = SloTarget(model, metric, seconds) if current is None else replace(current, threshold_seconds=seconds)
        if current != target:
            set_slo(sessions, target)
        recorded.append(target.label)
        noted[(model, metric)] = seconds
    _note(ledger, noted)
    return recorded, kept


def _ledger(path: Path) -> dict[str, float]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return {k: float(v) for k, v in data.items()} if isinstance(data, dict) else {}


def _note(path: Path, recorded: dict[tuple[str, str], float]) -> None:
    data = _ledger(path)
    data.update({f"{model}|{metric}": seconds for (model, metric), seconds in recorded.items()})
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1, sort_keys=True))
