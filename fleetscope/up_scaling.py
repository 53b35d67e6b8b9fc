"""``fleetscope up``'s autoscaling: the spec's ``autoscale`` section switched on or off, the autoscaler
started once the fleet is healthy (and calibrated), and its cold starts printed as they complete.

In:  the spec ``up`` starts and ``--autoscale/--no-autoscale``; the launcher; the store.
Out: ``with_autoscale`` -> the spec path to start (a copy with ``autoscale.enabled`` set when the
     flag asks for a change; ``UpError`` when the spec has no ``autoscale`` section to switch on);
     ``Scaling.start`` -> the autoscaler running (its targets file emptied first: a fresh fleet
     has no added replica); ``Scaling.lines`` -> the lines not printed yet, read back from the
     store with ``analytics.elasticity`` (the numbers the Capacity page shows): per cold start
     "tiny-small 1 -> 2: decided 10:03:01 (requests_waiting 2.4 > 2), healthy +41 s, first token
     +43 s (small-1)", per scale-in "tiny-small 2 -> 1: decided 10:09:00 (...), small-1 removed +17 s".
"""

from __future__ import annotations

import math
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pandas as pd
import yaml

from fleetscope.errors import UpError

__all__ = ["Scaling", "cold_start_lines", "with_autoscale", "with_queue_time"]


def with_autoscale(spec_path: Path, out: Path, enabled: bool | None) -> Path:
    """``spec_path`` itself, or a copy in ``out`` with ``autoscale.enabled: <enabled>``."""
    if enabled is None:
        return spec_path
    raw = yaml.safe_load(Path(spec_path).read_text()) or {}
    section = raw.get("autoscale")
    if not isinstance(section, dict):
        if not enabled:
            return spec_path
        raise UpError(
            f"--autoscale: {spec_path} has no autoscale section (pools and their policies; docs/fleet.md "
            '"The autoscaler")'
        )
    if bool(section.get("enabled", True)) == enabled:
        return spec_path
    raw["autoscale"] = {**section, "enabled": enabled}
    return write_spec_copy(raw, spec_path, out)


def with_queue_time(spec_path: Path, out: Path, enabled: bool | None) -> Path:
    """``spec_path`` itself, or a copy in ``out`` with its gateway's ``queue_time.enabled: <enabled>``
    (a scenario that asks for admission by queue time, or for none)."""
    raw = yaml.safe_load(Path(spec_path).read_text()) or {}
    gateway = raw.get("gateway")
    if enabled is None or not isinstance(gateway, dict):
        return spec_path
    section = gateway.get("queue_time") or {}
    if bool(section.get("enabled", False)) == enabled:
        return spec_path
    raw["gateway"] = {**gateway, "queue_time": {**section, "enabled": enabled}}
    return write_spec_copy(raw, spec_path, out)


def write_spec_copy(raw: dict[str, Any], spec_path: Path | str, out: Path) -> Path:
    """A changed copy of the fleet spec at ``out``; model paths stay the spec's, wherever the copy lives."""
    for name, model in (raw.get("models") or {}).items():
        if isinstance(model, dict) and "path" in model and not Path(model["path"]).is_absolute():
            model["path"] = str((Path(spec_path).resolve().parent / model["path"]).resolve())
            raw["models"][name] = model
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("# written by `fleetscope up` from " + str(spec_path) + "\n" + yaml.safe_dump(raw, sort_keys=False))
    return out


def _clock(ts: Any) -> str:
    return pd.Timestamp(ts).tz_convert(datetime.now().astimezone().tzinfo).strftime("%H:%M:%S")


def cold_start_lines(starts: pd.DataFrame) -> list[tuple[str, str]]:
    """(decision id, line) per cold start that reached its first token."""
    out = []
    rows: list[dict[Any, Any]] = starts.to_dict("records")
    for row in rows:
        if pd.isna(row["serving_at"]):
            continue
        ready = float(row["time_to_ready_s"])
        healthy = "" if math.isnan(ready) else f", healthy +{ready:.0f} s"
        out.append(
            (
                str(row["decision_id"]),
                f"{row['pool']} {row['from_replicas']} -> {row['to_replicas']}: decided {_clock(row['decided_at'])} "
                f"({row['signal']} {row['value']:.3g} > {row['threshold']:g}){healthy}, "
                f"first token +{float(row['time_to_first_token_s']):.0f} s ({row['replica']})",
            )
        )
    return out


class Scaling:
    """The autoscaler of one ``up`` run, and what of it was printed."""

    def __init__(self) -> None:
        self.since: datetime | None = None
        self.printed: set[str] = set()

    def start(self, launcher: Any, cpu_nice: int, echo: Callable[[str], None]) -> bool:
        """Start the autoscaler when the spec's ``autoscale`` is enabled; False when it is not."""
        from fleet.autoscale.actuator import TARGETS_FILE

        scale = launcher.spec.autoscale
        if scale is None or not scale.enabled:
            return False
        (launcher.state_dir / TARGETS_FILE).write_text("[]\n")
        self.since = datetime.now(UTC) - timedelta(seconds=5)
        launcher.start_autoscaler(cpu_nice=cpu_nice, progress=lambda line: echo(f"  {line}"))
        return True

    def lines(self, client: Any) -> list[str]:
        """The cold starts and scale-ins completed since the last call (none before ``start``)."""
        if self.since is None:
            return []
        from analytics.elasticity import cold_starts, scale_events

        end = datetime.now(UTC) + timedelta(seconds=1)
        new = [(i, line) for i, line in cold_start_lines(cold_starts(client, self.since, end)) if i not in self.printed]
        events: list[dict[Any, Any]] = scale_events(client, self.since, end, kinds=["scale_in", "removed"]).to_dict(
            "records"
        )
        decided = {e["decision_id"]: e for e in events if e["kind"] == "scale_in"}
        for row in events:
            d = decided.get(row["decision_id"])
            if row["kind"] != "removed" or d is None or row["decision_id"] in self.printed:
                continue
            seconds = (row["ts"] - d["ts"]).total_seconds()
            new.append(
                (
                    str(row["decision_id"]),
                    f"{row['pool']} {d['from_replicas']} -> {d['to_replicas']}: decided {_clock(d['ts'])} "
                    f"({d['signal']} {d['value']:.3g} < {d['threshold']:g}), {row['replica']} removed "
                    f"+{seconds:.0f} s ({row['detail']})",
                )
            )
        self.printed.update(i for i, _ in new)
        return [line for _, line in new]
