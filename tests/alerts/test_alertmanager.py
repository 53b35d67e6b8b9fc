"""fleetscope's alerts in a real Alertmanager (Debian's ``prometheus-alertmanager`` 0.25 and ``amtool``).

A replica's failed scrapes are written the way the collector writes them (its converter and
writer, into chDB); fleetscope's evaluator evaluates a rule on them and its deliverer pushes the
alerts to Alertmanager's v2 API through the outbox, step by step as ``fleetscope alerts run``
does (a scrape, an evaluation, a delivery pass). Alertmanager routes them to a real local
webhook receiver (``tests/alerts/receiver.py``). Everything runs on wall-clock time, because
Alertmanager does; nothing asserts a duration: each wait polls for a state, with a deadline.
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
from pydantic import ValidationError

from alerts import outbox
from alerts.config import AlertsSettings
from alerts.delivery import Deliverer, DeliveryReport
from alerts.evaluator import Evaluator
from alerts.model import Alert
from alerts.reading import Context
from alerts.rules import RuleFile
from collector.convert import Batch, SeriesConverter
from collector.exposition import SeriesCache, parse
from collector.scrape import ScrapeResult
from collector.targets import make_target
from collector.writer import Writer, WriterConfig
from migrations import clickhouse_runner
from tests.alerts.receiver import ScriptedReceiver
from tests.conftest import migrated_sessions
from tests.promtools import Proc, binary, free_port, started

DASHBOARD = "http://fleetscope.example:8501"
RULES = {
    "groups": [
        {
            "name": "availability",
            "interval": "1s",
            "rules": [
                {
                    "name": "ReplicaDown",
                    "expr": 'replica_up{window="1m"}',
                    "op": "==",
                    "threshold": 0,
                    "labels": {"severity": "page", "team": "inference"},
                    "annotations": {
                        "summary": "replica {{ $labels.replica }} is down: its last scrape failed",
                        "description": "{{ $labels.instance }} ({{ $labels.job }}) does not answer /metrics.",
                    },
                    "no_data": "OK",
                }
            ],
        }
    ]
}
REPLICAS = ("small-0", "small-1")
WAIT_S = 60.0  # the deadline of every wait below (each normally ends within seconds)


# --------------------------------------------------------------------------- the fleet and the path


class Fleet:
    """Two vLLM replicas as the collector sees them: each step one scrape of each, up or failed."""

    def __init__(self, client: Any, spool: Path) -> None:
        self.writer = Writer(client, WriterConfig(spool_dir=spool))
        self.targets = {
            r: make_target(f"127.0.0.1:{8100 + i}", job="vllm", interval_s=1, timeout_s=1, labels={"replica": r})
            for i, r in enumerate(REPLICAS)
        }
        self.converters = {r: SeriesConverter() for r in REPLICAS}
        self.caches = {r: SeriesCache() for r in REPLICAS}

    def scrape(self, down: set[str]) -> None:
        ts = time.time() - 0.05  # a scrape that has ended before the evaluation that follows
        for replica, target in self.targets.items():
            batch = Batch()
            if replica in down:
                result = ScrapeResult(target, ts, False, 0.01, 0, "connection refused", None)
            else:
                text = '# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting{model_name="tiny"} 0\n'
                exposition = parse(text, cache=self.caches[replica])
                result = ScrapeResult(target, ts, True, 0.01, len(exposition), "", exposition)
            self.converters[replica].convert(result, batch)
            self.writer.add_tables(batch.tables)
        assert self.writer.flush(), "the scrapes could not be written to chDB"


class AlertPath:
    """fleetscope's alert path over the fleet: scrape, evaluate, deliver; ``until`` repeats it."""

    def __init__(self, client: Any, sessions: Any, settings: AlertsSettings, fleet: Fleet) -> None:
        self.sessions = sessions
        self.fleet = fleet
        self.groups = RuleFile.model_validate(RULES).groups
        self.evaluator = Evaluator(self.groups, Context(client, sessions), sessions, settings)
        receivers = {r.name: r for r in settings.receivers}
        self.deliverer = Deliverer(sessions, receivers, backoff_base_s=0.2, backoff_cap_s=1.0)
        self.down: set[str] = set()
        self.last: DeliveryReport | None = None

    def step(self) -> DeliveryReport:
        self.fleet.scrape(self.down)
        for group in self.groups:
            self.evaluator.evaluate_group(group, datetime.now(UTC))
        self.last = self.deliverer.run_once()
        return self.last

    def until(self, what: str, condition: Callable[[], bool], diagnose: Callable[[], str] = lambda: "") -> None:
        deadline = time.monotonic() + WAIT_S
        while time.monotonic() < deadline:
            self.step()
            if condition():
                return
            time.sleep(0.1)
        rows = [(r.receiver, r.status, r.attempts, r.last_error) for r in outbox.log(self.sessions, limit=5)]
        raise AssertionError(f"timed out waiting for {what}; last pass {self.last}; outbox {rows}\n{diagnose()}")

    def pushes(self) -> list[dict[str, Any]]:
        """What fleetscope posted to Alertmanager and it accepted, oldest first (the outbox's bodies)."""
        rows = reversed(outbox.log(self.sessions, limit=10_000, receiver="am"))
        return [r.body for r in rows if r.status == "delivered"]


def carried(path: AlertPath, replica: str, status: str) -> int:
    """How many of the delivered pushes in the outbox carried ``replica``'s alert with ``status``."""
    return sum(
        1
        for body in path.pushes()
        for a in body["alerts"]
        if a["labels"].get("replica") == replica and a["status"] == status
    )


def delivered_pushes(path: AlertPath) -> int:
    """How many pushes Alertmanager has accepted: the pushes to one Alertmanager are numbered
    (``<stream>-<sequence>[-resend]``) and delivered in order, so the newest delivered one's number."""
    keys = [r.key for r in outbox.log(path.sessions, limit=10_000, receiver="am") if r.status == "delivered"]
    return max((int(k.split("-")[1]) for k in keys), default=0)


# --------------------------------------------------------------------------- Alertmanager


@contextmanager
def alertmanager(workdir: Path, hook: ScriptedReceiver, port: int | None = None) -> Iterator[Proc]:
    """A real Alertmanager routing every alert to ``hook``, one notification per replica and
    alertname, with timers short enough for a test; no clustering."""
    port = port or free_port()
    home = workdir / f"alertmanager-{port}"
    home.mkdir(parents=True)
    config = {
        "route": {
            "receiver": "hook",
            "group_by": ["alertname", "replica"],
            "group_wait": "200ms",
            "group_interval": "500ms",
            "repeat_interval": "1h",
        },
        "receivers": [
            {"name": "hook", "webhook_configs": [{"url": f"http://127.0.0.1:{hook.port}/hook", "send_resolved": True}]}
        ],
    }
    (home / "alertmanager.yml").write_text(json.dumps(config))  # JSON is YAML
    args = [
        f"--config.file={home / 'alertmanager.yml'}",
        f"--storage.path={home / 'data'}",
        f"--web.listen-address=127.0.0.1:{port}",
        "--cluster.listen-address=",
    ]
    with started("alertmanager", args, home, port=port) as proc:
        yield proc


def notified(hook: ScriptedReceiver) -> list[tuple[str, dict[str, Any]]]:
    """(status, alert) for every alert of every notification Alertmanager sent to ``hook``, in order."""
    return [(a["status"], a) for r in list(hook.requests) for a in json.loads(r.body)["alerts"]]


def notified_of(hook: ScriptedReceiver, replica: str, status: str) -> list[dict[str, Any]]:
    return [a for s, a in notified(hook) if s == status and a["labels"].get("replica") == replica]


def am_alerts(am: Proc) -> list[dict[str, Any]]:
    """What Alertmanager holds now (its API), active, suppressed and unprocessed alike."""
    answer = httpx.get(f"{am.url}/api/v2/alerts", timeout=5)
    answer.raise_for_status()
    alerts: list[dict[str, Any]] = answer.json()
    return alerts


def am_alert(am: Proc, replica: str) -> dict[str, Any] | None:
    return next((a for a in am_alerts(am) if a["labels"].get("replica") == replica), None)


def amtool(am: Proc, *args: str) -> str:
    done = subprocess.run(
        [binary("amtool"), f"--alertmanager.url={am.url}", *args],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert done.returncode == 0, f"amtool {' '.join(args)} failed: {done.stderr}"
    return done.stdout.strip()


def received(am: Proc) -> float:
    """Alerts Alertmanager took in through its API (its own counter, on /metrics)."""
    text = httpx.get(f"{am.url}/metrics", timeout=5).text
    lines = [line for line in text.splitlines() if line.startswith("alertmanager_alerts_received_total{")]
    return sum(float(line.rsplit(" ", 1)[1]) for line in lines)


def when(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


# --------------------------------------------------------------------------- fixtures


@pytest.fixture
def hook() -> Iterator[ScriptedReceiver]:
    server = ScriptedReceiver()
    yield server
    server.stop()


@pytest.fixture
def make_path(ch: Any, sqlite_url: str, tmp_path: Path) -> Iterator[Callable[[AlertsSettings], AlertPath]]:
    clickhouse_runner.apply(ch)
    metadata = migrated_sessions(sqlite_url)
    sessions = next(metadata)
    made: list[AlertPath] = []

    def make(settings: AlertsSettings) -> AlertPath:
        made.append(AlertPath(ch, sessions, settings, Fleet(ch, tmp_path / "spool")))
        return made[-1]

    yield make
    for path in made:
        path.deliverer.close()
    next(metadata, None)  # disposes of the engine


def settings(*urls: str, **more: Any) -> AlertsSettings:
    receivers = [{"name": "am", "type": "alertmanager", "urls": list(urls), "resend_interval": "1s"}]
    return AlertsSettings.model_validate(
        {"builtin_rules": False, "receivers": receivers + more.pop("receivers", []), "external_url": DASHBOARD, **more}
    )


# --------------------------------------------------------------------------- the tests


def test_alertmanager_notifies_a_fleetscope_alert_with_its_labels_and_keeps_it_active_between_resends(
    tmp_path: Path, hook: ScriptedReceiver, make_path: Callable[[AlertsSettings], AlertPath]
) -> None:
    oncall = ScriptedReceiver()  # fleetscope's own webhook notifier stays the default route
    try:
        with alertmanager(tmp_path, hook) as am:
            webhook = {"name": "oncall", "type": "webhook", "url": f"http://127.0.0.1:{oncall.port}/"}
            path = make_path(settings(am.url, receivers=[webhook], route={"receiver": "oncall", "group_wait": "0s"}))
            path.down = {"small-0"}
            path.until(
                "Alertmanager to notify the webhook",
                lambda: bool(notified_of(hook, "small-0", "firing")),
                lambda: f"Alertmanager holds {am_alerts(am)}\n{am.log_text()}",
            )
            [got] = notified_of(hook, "small-0", "firing")
            assert got["labels"] == {
                "alertname": "ReplicaDown",
                "replica": "small-0",
                "instance": "127.0.0.1:8100",
                "job": "vllm",
                "severity": "page",
                "team": "inference",
            }
            assert got["annotations"] == {
                "summary": "replica small-0 is down: its last scrape failed",
                "description": "127.0.0.1:8100 (vllm) does not answer /metrics.",
            }
            assert got["generatorURL"].startswith(f"{DASHBOARD}/investigate?")
            [inst] = path.evaluator.states["ReplicaDown"].values()
            assert when(got["startsAt"]) == inst.fired_at.replace(microsecond=inst.fired_at.microsecond // 1000 * 1000)
            assert not notified_of(hook, "small-1", "firing")  # the replica that answers is not paged

            # Prometheus' keep-alive: each push says "active until 4 resends from now"; once the first
            # push's endsAt has passed, the re-sends have kept the alert active in Alertmanager
            first_ends = when(path.pushes()[0]["alerts"][0]["endsAt"])
            path.until("the first push's endsAt to pass", lambda: datetime.now(UTC) > first_ends)
            alert = am_alert(am, "small-0")
            assert alert is not None and alert["status"]["state"] == "active"
            assert when(alert["endsAt"]) > first_ends
            assert delivered_pushes(path) >= 3 and received(am) >= 3
            assert not notified_of(hook, "small-0", "resolved")
            # the notification log keeps the push that changed something and the newest re-send, not one row each
            assert len(outbox.log(path.sessions, receiver="am")) == 2

            # and the webhook receiver of fleetscope's own notifier got its Alertmanager-v4 body as before
            path.until("fleetscope's own webhook notification", lambda: bool(oncall.requests))
            body = json.loads(oncall.requests[0].body)
            assert body["version"] == "4" and body["alerts"][0]["labels"]["replica"] == "small-0"
    finally:
        oncall.stop()


def test_an_amtool_silence_stops_the_notification_while_fleetscope_keeps_sending(
    tmp_path: Path, hook: ScriptedReceiver, make_path: Callable[[AlertsSettings], AlertPath]
) -> None:
    with alertmanager(tmp_path, hook) as am:
        silence = amtool(
            am,
            "silence",
            "add",
            "alertname=ReplicaDown",
            "replica=small-0",
            "--author=sre",
            "--comment=draining small-0",
            "--duration=1h",
        )
        path = make_path(settings(am.url))
        path.down = {"small-0", "small-1"}
        path.until(
            "small-1's notification, small-0 silenced in Alertmanager and pushed again and again",
            lambda: (
                bool(notified_of(hook, "small-1", "firing"))
                and (am_alert(am, "small-0") or {}).get("status", {}).get("silencedBy") == [silence]
                and delivered_pushes(path) >= 3
            ),
            lambda: f"Alertmanager holds {am_alerts(am)}",
        )
        assert am_alert(am, "small-0")["status"]["state"] == "suppressed"  # type: ignore[index]
        assert notified_of(hook, "small-0", "firing") == []  # silenced: the receiver got nothing of it
        # while fleetscope went on pushing it: every push carried both replicas, and Alertmanager took them in
        assert carried(path, "small-0", "firing") == len(path.pushes()) and received(am) >= 2 * 3

        amtool(am, "silence", "expire", silence)
        path.until(
            "small-0's notification once the silence expired", lambda: bool(notified_of(hook, "small-0", "firing"))
        )
        assert notified_of(hook, "small-0", "firing")[0]["annotations"]["summary"].startswith("replica small-0 is down")


def test_the_resolution_reaches_the_receiver_as_resolved_once(
    tmp_path: Path, hook: ScriptedReceiver, make_path: Callable[[AlertsSettings], AlertPath]
) -> None:
    with alertmanager(tmp_path, hook) as am:
        path = make_path(settings(am.url))
        path.down = {"small-0"}
        path.until("the firing notification", lambda: bool(notified_of(hook, "small-0", "firing")))

        path.down = set()  # small-0 answers its scrapes again
        path.until(
            "the resolved notification",
            lambda: bool(notified_of(hook, "small-0", "resolved")),
            lambda: f"Alertmanager holds {am_alerts(am)}",
        )
        [got] = notified_of(hook, "small-0", "resolved")
        [inst] = path.evaluator.states["ReplicaDown"].values()
        assert inst.state == "resolved" and inst.resolved_at is not None
        assert when(got["endsAt"]) == inst.resolved_at.replace(microsecond=inst.resolved_at.microsecond // 1000 * 1000)
        assert got["labels"]["alertname"] == "ReplicaDown" and got["labels"]["severity"] == "page"

        for _ in range(3):  # more evaluations: nothing fires, so nothing more is pushed
            path.step()
        assert carried(path, "small-0", "resolved") == 1
        assert path.pushes()[-1]["alerts"] == [a for a in path.pushes()[-1]["alerts"] if a["status"] == "resolved"]


def test_a_dead_alertmanager_keeps_its_push_for_retry_while_the_other_of_the_pair_pages(
    tmp_path: Path, hook: ScriptedReceiver, make_path: Callable[[AlertsSettings], AlertPath]
) -> None:
    dead_port = free_port()  # nobody listens there yet
    dead = f"http://127.0.0.1:{dead_port}"
    with alertmanager(tmp_path, hook) as live:
        path = make_path(settings(dead, live.url))
        path.down = {"small-0"}
        path.until("the live Alertmanager's notification", lambda: bool(notified_of(hook, "small-0", "firing")))
        [row] = [r for r in outbox.log(path.sessions) if r.body["url"] == dead]
        assert row.status == "pending" and row.attempts >= 1
        assert row.last_error is not None
        assert row.last_error.startswith(f"Alertmanager at {dead}/api/v2/alerts: ConnectError")
        assert "refused" in row.last_error.lower()

        # the outage lasts past the push's own endsAt; re-sends do not pile up behind the waiting push
        ends = when(row.body["alerts"][0]["endsAt"])
        path.until("the waiting push's endsAt to pass", lambda: datetime.now(UTC) > ends)
        waiting = [r for r in outbox.log(path.sessions) if r.body["url"] == dead]
        assert [r.status for r in waiting] == ["pending"] and waiting[0].attempts >= 2

        with alertmanager(tmp_path, hook, port=dead_port) as back:  # it comes back
            path.until(
                "the kept push delivered",
                lambda: [r.status for r in outbox.log(path.sessions) if r.key == row.key] == ["delivered"],
            )
            alert = am_alert(back, "small-0")
            assert alert is not None and alert["status"]["state"] == "active"  # not ended in the past
            assert when(alert["endsAt"]) > datetime.now(UTC)
            assert alert["labels"]["alertname"] == "ReplicaDown"


def test_names_alertmanager_would_refuse_are_rewritten_so_the_push_is_accepted(
    tmp_path: Path, hook: ScriptedReceiver, make_path: Callable[[AlertsSettings], AlertPath]
) -> None:
    """A label from a rule's SQL column can be any text; one bad name makes Alertmanager refuse the
    whole push (400), so every other alert would be lost with it."""
    with alertmanager(tmp_path, hook) as am:
        path = make_path(settings(am.url))
        odd = Alert(
            labels={"alertname": "PoolCostUp", "pool-name": "tiny small", "9lives": "x", "empty": ""},
            annotations={"summary": "cost up"},
            status="firing",
            starts_at=datetime.now(UTC),
        )
        path.evaluator.notifier.dispatch([odd], datetime.now(UTC))
        assert path.deliverer.run_once().delivered == 1
        [held] = [a for a in am_alerts(am) if a["labels"]["alertname"] == "PoolCostUp"]
        assert held["labels"] == {"alertname": "PoolCostUp", "pool_name": "tiny small", "_9lives": "x"}


@pytest.mark.parametrize(
    ("receiver", "message"),
    [
        ({}, "receiver 'am': an alertmanager receiver needs url (or urls)"),
        ({"url": "ftp://am:9093"}, "url\n  Value error, must be an http:// or https:// URL, got 'ftp://am:9093'"),
        ({"url": "http://ops:pw@am:9093"}, "url\n  Value error, must not hold credentials (am): give them in headers"),
        ({"url": "http://am:9093/api/v2/alerts"}, "must be Alertmanager's base URL (fleetscope adds /api/v2/alerts)"),
        ({"urls": ["http://am-0:9093", "http://am-0:9093/"]}, "Alertmanager URL http://am-0:9093 is given twice"),
        (
            {"url": "http://am:9093", "resend_interval": "0s"},
            "resend_interval\n  Value error, must be between 1s and 60m",
        ),
        (
            {"url": "http://am:9093", "resend_interval": "2h"},
            "must be between 1s and 60m (Prometheus re-sends every 1m), got 7200s",
        ),
        (
            {"url": "http://am:9093", "resend_interval": "soon"},
            "not a duration: 'soon' (write e.g. 30s, 5m, 1h30m, 3d)",
        ),
        ({"url": "http://am:9093", "send_resolved": False}, "send_resolved is Alertmanager's to decide"),
    ],
)
def test_bad_alertmanager_settings_are_refused_with_what_to_change(receiver: dict, message: str) -> None:
    with pytest.raises(ValidationError) as refused:
        AlertsSettings.model_validate({"receivers": [{"name": "am", "type": "alertmanager", **receiver}]})
    assert message in str(refused.value)


def test_alertmanager_settings_that_belong_elsewhere_are_refused() -> None:
    with pytest.raises(ValidationError, match="resend_interval is only for alertmanager receivers"):
        AlertsSettings.model_validate(
            {"receivers": [{"name": "ops", "type": "webhook", "url": "http://hook:9/", "resend_interval": "1m"}]}
        )
    with pytest.raises(ValidationError, match="an alertmanager receiver: it gets every alert, and Alertmanager routes"):
        AlertsSettings.model_validate(
            {
                "receivers": [{"name": "am", "type": "alertmanager", "url": "http://am:9093"}],
                "route": {"receiver": "am"},
            }
        )
    only = AlertsSettings.model_validate(
        {"receivers": [{"name": "am", "type": "alertmanager", "url": "http://am:9093"}]}
    )
    assert only.default_route() is None and only.receivers[0].resend_interval_s == 60.0
